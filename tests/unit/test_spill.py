"""What memory forgets goes to disk first (issue 16, item 6; block_store/spill.py): a cached page
whose memory is reused and a loose GDN entry evicted are written by key, so a later prompt
with that prefix (another reader on the folder too) resumes from disk, exact; nothing is
written without a disk; a failed write is counted and the read goes on; a park hands its
states over to the GDN table instead of copying them."""
import random
import time

import pytest
from helpers import disk_reader, rand_ids  # noqa: E402

import block_store.spill as spill_mod
from block_store.disk.store import DiskStore

G = 64
CAP = 600_000      # random:tiny: 64 KiB a page, 60 KiB a GDN entry; b alone (8 pages) is past it


def _forgotten_prefix(r, rng):
    """a reads 4 G + 7 ids and is deleted (its pages cached, its entries loose, no file
    written), then b reads 8 G + 3 others, reusing a's pages; past the cap, the loose
    entries are evicted. Returns (a's ids, a's page keys, a's entry keys and lines)."""
    ids = rand_ids(4 * G + 7, rng)
    r.feed("a", ids, "prompt")
    r.read("a")
    st = r.table.resident["a"]
    keys = list(st.keys)
    entries = {e.key: e.line for e in [c.entry for c in st.checkpoints] + st.tip}
    r.drop("a")
    if r.table.store.disk is not None:
        assert r.stats()["pages"]["disk"] == 0 and r.stats()["gdn_entries"]["disk"] == 0
    r.feed("b", rand_ids(8 * G + 3, rng), "prompt")
    r.read("b")
    store = r.table.store
    assert all(store.manager.lookup(k, ids[i * G:(i + 1) * G]) is None
               for i, k in enumerate(keys))                     # a's pages were reused
    assert not any(k in store.gdn.entries for k in entries)     # a's entries evicted
    return ids, keys, entries


def test_reused_pages_and_evicted_entries_go_to_disk_and_a_new_reader_resumes(tiny, tmp_path):
    r = disk_reader(tiny, tmp_path, G, resident_bytes=CAP)
    ids, keys, entries = _forgotten_prefix(r, random.Random(1))
    spill = r.table.store.spill
    spill.flush()
    disk = r.table.store.disk
    assert spill.counters.pages == 4 and spill.counters.write_errors == 0
    assert all(disk.has_page(k) for k in keys)
    assert all(disk.has_entry(k, look=True) for k in entries)
    st = r.stats()          # the same counts in stats() (and /metrics: tests/unit/test_server.py)
    assert st["evicted_written"] == {"page": 4, "gdn_entry": spill.counters.entries}
    assert spill.counters.entries >= len(entries) > 0
    assert st["pages_reused"] >= 4 and st["gdn_entries_evicted"] >= len(entries)
    assert r.check_exact("b")
    # this reader finds them again: pages and the state at 4 G from disk
    r.feed("c", ids[:4 * G] + [5] * 9, "prompt")
    assert r.committed("c") == 4 * G and r.stats()["prefix_cache_hit_tokens"]["disk"] == 4 * G
    r2 = disk_reader(tiny, tmp_path, G)                 # a new reader on the folder: the same
    r2.feed("d", ids[:4 * G] + [6] * 70, "prompt")
    s = r2.stats()
    assert r2.committed("d") == 4 * G and s["read_tokens"] == 0
    assert s["prefix_cache_hit_tokens"]["disk"] == 4 * G
    r2.read("d")
    assert r2.check_exact("d") and r.check_exact("c")


def test_an_evicted_loose_entry_is_on_disk_with_its_line_and_kind(tiny, tmp_path):
    """Its pages stay in memory: a prompt resumes at its line from the entry on disk."""
    rng = random.Random(2)
    r = disk_reader(tiny, tmp_path, G)
    ids = rand_ids(3 * G + 5, rng)
    r.feed("a", ids, "prompt")
    r.read("a")
    st = r.table.resident["a"]
    kinds = {e.key: (e.line, e.kind) for e in [c.entry for c in st.checkpoints] + st.tip}
    r.drop("a")
    store = r.table.store
    store.gdn.evict(0)
    assert not store.gdn.entries
    store.spill.flush()
    assert store.spill.counters.entries == len(kinds) == 3    # the ring's G, 2G; 3G's
    for key, (line, kind) in kinds.items():
        got_line, _, got_kind = store.disk.read_entry(key)
        assert (got_line, got_kind) == (line, kind)
    r.feed("b", ids + [9], "prompt")
    assert r.committed("b") == 3 * G                 # memory's pages, the disk's state
    r.read("b")
    assert r.check_exact("b")


def test_nothing_is_copied_or_written_without_a_disk(tiny, monkeypatch):
    calls = []
    for name in ("write_page", "write_entry", "keep_page", "has_entry"):
        monkeypatch.setattr(DiskStore, name, lambda *a, n=name, **k: calls.append(n))
    monkeypatch.setattr(spill_mod, "page_rows", lambda *a, **k: calls.append("copy"))
    r = disk_reader(tiny, None, G, resident_bytes=CAP)
    store = r.table.store
    assert store.spill is None and store.manager.on_reuse is None and store.gdn.on_evict is None
    _forgotten_prefix(r, random.Random(3))
    assert calls == [] and store.gdn.num_evicted > 0
    st = r.stats()
    assert st["evicted_written"] == {"page": 0, "gdn_entry": 0}
    assert st["pages_reused"] >= 4 and st["gdn_entries_evicted"] == store.gdn.num_evicted
    assert r.check_exact("b")


@pytest.mark.parametrize("fail", ["write", "copy"])
def test_a_failing_write_is_counted_and_the_read_goes_on(tiny, tmp_path, monkeypatch, fail):
    def broken(*a, **k):
        raise OSError("disk full")
    if fail == "write":
        monkeypatch.setattr(DiskStore, "write_page", broken)
        monkeypatch.setattr(DiskStore, "write_entry", broken)
    else:                                        # the copy off the device fails
        monkeypatch.setattr(spill_mod, "page_rows", broken)
    r = disk_reader(tiny, tmp_path, G, resident_bytes=CAP)
    ids, keys, entries = _forgotten_prefix(r, random.Random(4))
    r.table.store.spill.flush()
    errors = 4 + (len(entries) if fail == "write" else 0)
    assert r.stats()["write_errors"] == errors
    assert not any(r.table.store.disk.has_page(k) for k in keys)
    assert r.check_exact("b")
    r.feed("c", ids, "prompt")                   # nothing held: read again from 0
    assert r.committed("c") == 0
    r.read("c")
    assert r.check_exact("c")


def test_the_write_behind_is_bounded(tiny, tmp_path, monkeypatch):
    """At most max_pending writes are queued, however slow the disk; all are written."""
    write = DiskStore.write_page

    def slow(self, *a, **k):
        time.sleep(0.02)
        return write(self, *a, **k)
    monkeypatch.setattr(DiskStore, "write_page", slow)
    r = disk_reader(tiny, tmp_path, G, resident_bytes=CAP)
    spill = r.table.store.spill
    spill.max_pending, seen = 2, []
    submit = spill._submit

    def watched(*a):
        submit(*a)
        seen.append(len(spill._queue))
    monkeypatch.setattr(spill, "_submit", watched)
    _, keys, _ = _forgotten_prefix(r, random.Random(5))
    r.close()                                    # a planned stop waits for the writes
    assert seen and max(seen) <= 2
    assert all(r.table.store.disk.has_page(k) for k in keys)


@pytest.mark.parametrize("disk", [False, True])
def test_a_park_hands_its_states_over_without_a_copy(tiny, tmp_path, disk):
    """The states at C of a parked session are its tip ring's newest entry (no copy at the
    park), marked 'state' (what a restore resumes from), unreferenced; the restore resumes
    from a copy of them, exact."""
    rng = random.Random(6)
    r = disk_reader(tiny, tmp_path if disk else None, G)
    r.feed("a", rand_ids(6 * G + 5, rng), "prompt")
    r.read("a", max_chunks=2)                    # C = 2 G: no checkpoint there, a tip
    st = r.table.resident["a"]
    key, newest = st.keys[-1], st.tip[-1]
    assert newest.key == key and newest.kind == "tip"
    num_entries = len(r.table.store.gdn.entries)
    r.table.park("a")
    entry = r.table.store.gdn.entries[key]
    assert entry is newest and len(r.table.store.gdn.entries) == num_entries
    assert entry.kind == "state" and entry.line == 2 * G and entry.refs == 0
    assert r.committed("a") == 2 * G             # restored: memory's pages and entry
    back = r.table.resident["a"]
    assert all(a is not c for (a, _), (c, _) in zip(back.gdn, entry.states))
    r.read("a")
    assert r.check_exact("a")


def test_tips_that_rotated_out_unused_are_not_written(tiny, tmp_path, monkeypatch):
    """A session followed turn by turn gives up tips behind its ring; unused, they go at once,
    counted and not copied or written (GdnTable.give_up); its checkpoints still are, and the
    state stays exact. Without the policy every rotated tip would be a file (about 19 MB on
    0.8B)."""
    from block_store.memory.gdn_table import GdnTable
    given = []
    give_up = GdnTable.give_up
    monkeypatch.setattr(GdnTable, "give_up",
                        lambda self, e: (given.append(e), give_up(self, e))[1])
    r = disk_reader(tiny, tmp_path, G, resident_bytes=CAP)
    rng = random.Random(6)
    ids = rand_ids(14 * G, rng)
    for end in range(2 * G + 5, 14 * G, G + 40):           # turns of G + 40 ids
        r.feed("a", ids[:end], "prompt")
        r.read("a")
    store = r.table.store
    store.spill.flush()
    st = r.stats()
    gone = [e for e in given if e.kind == "tip" and not e.spill and e.hits == 0
            and e.key not in store.gdn.entries]
    assert gone and st["gdn_entries_not_written"] == len(gone)
    assert not any(store.disk.has_entry(e.key, look=True) for e in gone)
    written = st["evicted_written"]["gdn_entry"]
    assert written + st["gdn_entries_not_written"] <= st["gdn_entries_evicted"]
    assert st["gdn_entry_evictions"]["tip"] >= len(gone)
    assert r.check_exact("a")
