"""Page files read ahead of a restore, outside the reader's lock (block_store.disk.prefetch,
disk_io.prefetch_pages): the holder's bounds, and a parked session restored from rows read
ahead, with no page file read under the lock, bit for bit as read from its files."""
import random
import threading
import time

import pytest
import torch
from helpers import disk_reader, rand_ids  # noqa: E402

import block_store.disk_io as disk_io
from block_store.disk.prefetch import PrefetchedPages

G = 64


def _rows(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.uint8)


def test_the_holder_keeps_its_bytes_and_drops_the_oldest_first():
    pre = PrefetchedPages(max_bytes=10)
    assert pre.put(b"a", [1], _rows(4)) and pre.put(b"b", [2], _rows(4))
    assert pre.free_bytes() == 2
    assert pre.put(b"c", [3], _rows(4))             # 12 > 10: a goes
    assert b"a" not in pre and b"b" in pre and pre.held_bytes == 8
    assert not pre.put(b"d", [4], _rows(11))        # alone over the cap: refused, nothing lost
    assert len(pre) == 2 and pre.held_bytes == 8
    assert pre.put(b"b", [2], _rows(2)) and pre.held_bytes == 6     # replaced
    assert pre.take(b"c", [9]) is None and b"c" not in pre          # read for other ids
    assert pre.put(b"c", [3], _rows(4))
    got = pre.take(b"c", [3])
    assert got is not None and got.numel() == 4 and pre.take(b"c", [3]) is None
    pre.clear()
    assert pre.counts() == {"num_put": 5, "num_taken": 1, "num_dropped": 4, "num_held": 0,
                            "held_bytes": 0}
    with pytest.raises(ValueError, match="max_bytes"):
        PrefetchedPages(-1)


def test_rows_not_taken_in_time_are_dropped():
    pre = PrefetchedPages(max_bytes=100, max_age_s=0.05)
    pre.put(b"a", [1], _rows(4))
    time.sleep(0.1)
    assert pre.counts()["num_held"] == 1            # counts() reports, drops nothing
    pre.drop_aged()                                 # as the reader's settle does
    assert pre.counts()["num_held"] == 0 and pre.counts()["num_dropped"] == 1


def _parked(tiny, tmp_path, num_chunks=5, seed=2):
    """A reader whose session "a" (num_chunks whole chunks and a few ids) was read, parked,
    and its pages and entries forgotten by memory: a restore must load it from disk."""
    r = disk_reader(tiny, tmp_path, G)
    r.feed("a", rand_ids(num_chunks * G + 7, random.Random(seed)), "prompt")
    r.read("a")
    before = {k: v.clone() for k, v in r.state_tensors("a").items()}
    r.table.park("a")
    assert r.table.store.manager.forget_cached() == num_chunks
    r.table.store.gdn.evict(0)
    return r, before


def _count_file_reads(monkeypatch) -> list:
    """The page files read_page_into opens from here on (disk_io's, under the lock or not)."""
    reads = []
    real = disk_io.read_page_into

    def counted(disk, key, ids, out, *a, **kw):
        reads.append((threading.current_thread().name, key))
        return real(disk, key, ids, out, *a, **kw)
    monkeypatch.setattr(disk_io, "read_page_into", counted)
    return reads


def test_a_parked_session_restores_from_rows_read_ahead_bit_for_bit(tiny, tmp_path,
                                                                     monkeypatch):
    r, before = _parked(tiny, tmp_path)
    reads = _count_file_reads(monkeypatch)
    assert r.prefetch("a") == 5 and len(reads) == 5
    assert r.prefetch("a") == 0                     # held already: nothing read again
    pre = r.table.store.prefetched
    assert pre.counts()["num_held"] == 5
    page_bytes = r.table.store.pool.page_bytes      # each page its own buffer: held = counted
    assert all(rows.untyped_storage().nbytes() == page_bytes for rows, _, _ in
               pre._rows.values())
    hits = r.stats()["prefix_cache_hit_tokens"]
    after = r.state_tensors("a")                    # the restore
    assert len(reads) == 5                          # no page file read under the lock
    assert all(before[k].equal(after[k]) for k in before)
    assert pre.counts()["num_taken"] == 5 and pre.counts()["num_held"] == 0
    assert r.stats()["prefetch"] == {"num_put": 5, "num_taken": 5, "num_dropped": 0,
                                     "num_held": 0, "held_bytes": 0}
    got = r.stats()["prefix_cache_hit_tokens"]
    assert got["disk"] - hits["disk"] == 5 * G      # still counted as the disk tier's
    r.read("a")
    assert r.check_exact("a")


def test_a_restore_reads_what_was_not_read_ahead(tiny, tmp_path, monkeypatch):
    """Two of five pages read ahead (one dropped after): the restore takes the one held and
    reads the other four from their files, bit for bit."""
    r, before = _parked(tiny, tmp_path)
    reads = _count_file_reads(monkeypatch)
    ids = r.table.residency.parked["a"].ids
    assert disk_io.prefetch_pages(r.table.store, ids, max_pages=2) == 2
    pre = r.table.store.prefetched
    pre.clear()                                     # as if aged out
    assert disk_io.prefetch_pages(r.table.store, ids, max_pages=1) == 1
    after = r.state_tensors("a")
    assert len(reads) == 2 + 1 + 4
    assert all(before[k].equal(after[k]) for k in before)


def test_nothing_is_read_ahead_for_a_resident_session_or_without_a_disk(tiny, tmp_path,
                                                                         monkeypatch):
    r = disk_reader(tiny, tmp_path, G)
    r.feed("a", rand_ids(3 * G, random.Random(1)), "prompt")
    r.read("a")
    reads = _count_file_reads(monkeypatch)
    assert r.prefetch("a") == 0 and r.prefetch("unknown") == 0 and not reads
    from shadow_plugin.reader.reader import Reader
    plain = Reader(tiny, grid=G)
    assert plain.table.store.prefetched is None and plain.prefetch("a", [1, 2, 3]) == 0
    assert plain.stats()["prefetch"] is None
    with pytest.raises(ValueError):
        r.prefetch("")


def test_a_new_sessions_prefix_on_disk_is_read_ahead_from_its_prompt(tiny, tmp_path,
                                                                      monkeypatch):
    """A session this reader never held, whose prompt begins with another's pages on disk
    (forgotten by memory): its prompt's pages are read ahead, and its resume takes them."""
    r, _ = _parked(tiny, tmp_path, num_chunks=4, seed=5)
    prompt = [int(x) for x in r.table.residency.parked["a"].ids[:4 * G]] + \
        rand_ids(G + 3, random.Random(9))
    reads = _count_file_reads(monkeypatch)
    assert r.prefetch("b", prompt) == 4 and len(reads) == 4
    r.feed("b", prompt, "prompt")
    assert len(reads) == 4 and r.committed("b") == 4 * G
    r.read("b")
    assert r.check_exact("b")


def test_nothing_is_read_past_the_deepest_line_a_resume_can_take(tiny, tmp_path, monkeypatch):
    """A new session sharing 4 of a parked session's 5 pages, its GDN states on disk at 3 G
    and 4 G gone (as the TTL deletes files): a resume stops at the deepest line with a state
    (2 G), so only the 2 pages below it are read ahead, and both are taken."""
    r, _ = _parked(tiny, tmp_path, num_chunks=5, seed=6)
    held = [int(x) for x in r.table.residency.parked["a"].ids]
    store = r.table.store
    assert store.disk.entry_path(_key_at(store, held, 2)).is_file()
    for i in (3, 4):
        store.disk.entry_path(_key_at(store, held, i)).unlink(missing_ok=True)
    prompt = held[:4 * G] + rand_ids(G + 3, random.Random(7))
    reads = _count_file_reads(monkeypatch)
    want = 2
    assert r.prefetch("b", prompt) == want and len(reads) == want
    r.feed("b", prompt, "prompt")
    assert r.committed("b") == want * G and len(reads) == want
    assert r.stats()["prefetch"]["num_held"] == 0


def _key_at(store, ids, n):
    keys = []
    for i in range(n):
        keys.append(store.key_after(keys, ids[i * G:(i + 1) * G]))
    return keys[-1]


def test_two_sessions_read_ahead_in_turn_keep_each_others_rows(tiny, tmp_path, monkeypatch):
    """The read-ahead takes what the holder has room for, never evicting rows read for
    another session: two parked sessions read ahead one after the other under a cap of 6
    pages (5 each): the first keeps its 5, the second gets 1, and both restores take theirs."""
    r = disk_reader(tiny, tmp_path, G)
    for sid, seed in (("a", 1), ("b", 2)):
        r.feed(sid, rand_ids(5 * G + 3, random.Random(seed)), "prompt")
        r.read(sid)
        r.table.park(sid)
    r.table.store.manager.forget_cached()
    store = r.table.store
    store.prefetched = PrefetchedPages(6 * store.pool.page_bytes)
    assert r.prefetch("a") == 5 and r.prefetch("b") == 1
    reads = _count_file_reads(monkeypatch)
    r.state_tensors("a")
    r.state_tensors("b")
    assert len(reads) == 4 and store.prefetched.counts()["num_taken"] == 6
    assert r.check_exact("a") and r.check_exact("b")


def test_the_read_aheads_memory_is_a_setting(tiny, tmp_path):
    """SHADOW_PREFETCH_GB reaches the reader's holder (0: no read-ahead); a negative one is
    refused at start naming the variable; unset it is half the resident cap, at most 2 GiB."""
    from shadow_plugin.reader.reader import Reader
    from shadow_plugin.server.config import ServiceConfig
    from shadow_plugin.server.startup import check_paths
    env = {"SHADOW_MODEL": "random:tiny", "SHADOW_DIR": str(tmp_path / "state")}
    assert ServiceConfig.from_env(env).prefetch_gb is None
    assert ServiceConfig.from_env({**env, "SHADOW_PREFETCH_GB": "0.5"}).prefetch_gb == 0.5
    with pytest.raises(ValueError, match="SHADOW_PREFETCH_GB"):
        check_paths(ServiceConfig.from_env({**env, "SHADOW_PREFETCH_GB": "-1"}))
    sized = Reader(tiny, grid=G, disk_dir=tmp_path / "d1", prefetch_bytes=3 * 2**20)
    assert sized.table.store.prefetched.max_bytes == 3 * 2**20
    assert Reader(tiny, grid=G, disk_dir=tmp_path / "d2",
                  prefetch_bytes=0).table.store.prefetched is None
    default = Reader(tiny, grid=G, disk_dir=tmp_path / "d3", resident_bytes=2**30)
    assert default.table.store.prefetched.max_bytes == 2**29
