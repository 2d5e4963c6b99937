"""Several readers on one disk folder (disk_shared): versioned manifests, a newer one taken in
place of an older copy, pages written for the next reader, and the sweep's grace period."""
import os
import random
import time

import pytest
from helpers import DISK_IDENT, DISK_ROOT, disk_page, disk_reader, rand_ids  # noqa: E402

from block_store.disk.manifest import Manifest, Superseded
from block_store.disk.store import DiskStore
from block_store.memory.keys import page_keys
from shadow_plugin.reader.conflicts import StaleSession

G = 64


def test_a_manifest_is_replaced_only_over_the_version_its_writer_saw(tmp_path):
    one, two = DiskStore(tmp_path, DISK_IDENT), DiskStore(tmp_path, DISK_IDENT)
    ids = list(range(100))
    m = Manifest(ids, 0, [], None)
    one.write_manifest("s", m)
    assert m.mark == (one.writer, 1) and one.writer != two.writer
    seen = two.read_manifest("s").mark
    two.write_manifest("s", Manifest(ids + [7], 0, [], None), seen)
    with pytest.raises(Superseded) as e:                 # one's copy is older: nothing written
        one.write_manifest("s", Manifest(ids, 0, [], None), m.mark)
    assert e.value.mark == (two.writer, 2)
    back = one.read_manifest("s")
    assert back.ids == ids + [7] and back.mark == (two.writer, 2)
    with pytest.raises(Superseded):                      # none expected, one there
        one.write_manifest("s", Manifest(ids, 0, [], None))


def test_a_session_moves_between_readers_and_the_older_copy_gives_way(tiny, tmp_path):
    rng = random.Random(3)
    a, b = (disk_reader(tiny, tmp_path, G, disk_shared=True) for _ in range(2))
    first = rand_ids(3 * G + 10, rng)
    a.feed("s", first, "prompt")
    a.read("s")                      # read up: its pages and states written for b
    second = first + rand_ids(2 * G, rng)
    b.feed("s", second, "prompt")
    assert b.stats()["prefix_cache_hit_tokens"]["disk"] == 3 * G
    b.read("s")
    assert b.stats()["read_tokens"] == 2 * G and b.check_exact("s")
    with pytest.raises(StaleSession):                # a's copy is older: outputs refused
        a.feed("s", [5], "output")
    assert a.stats()["superseded"] == 1 and a.ids("s") == second
    a.table.close()                  # parks nothing of its own over b's manifest
    assert b.table.store.disk.read_manifest("s").ids == second
    third = second + rand_ids(G, rng)
    a.feed("s", third, "prompt")     # takes the folder's version, resumes at b's C
    a.read("s")
    assert a.committed("s") == 6 * G and a.check_exact("s")
    assert a.stats()["read_tokens"] == 3 * G + G          # its own first 3 pages, then one


def test_the_sweep_spares_files_younger_than_the_grace_period(tmp_path):
    store = DiskStore(tmp_path, DISK_IDENT)
    ids = list(range(3 * G))
    keys = page_keys(DISK_ROOT, ids, G)
    for i, k in enumerate(keys):
        store.write_page(k, ids[i * G:(i + 1) * G], disk_page(i))
    old = time.time() - 3600
    os.utime(store.page_path(keys[0]), (old, old))
    assert store.sweep(ttl_s=60, cap_bytes=0, grace_s=30) == [store.page_path(keys[0])]
    assert set(store.sweep(ttl_s=60, cap_bytes=0, grace_s=0)) == {store.page_path(keys[1]),
                                                                  store.page_path(keys[2])}


def test_the_sweep_spares_a_file_another_process_renewed_after_the_listing(tmp_path,
                                                                           monkeypatch):
    """The sweep lists the folder, then deletes; a lookup in another process renews a file
    it is about to read in between (upkeep.renew): with a grace period the file stays."""
    from block_store.disk import upkeep
    store = DiskStore(tmp_path, DISK_IDENT)
    ids = list(range(2 * G))
    keys = page_keys(DISK_ROOT, ids, G)
    for i, k in enumerate(keys):
        store.write_page(k, ids[i * G:(i + 1) * G], disk_page(i))
    old = time.time() - 3600
    for k in keys:
        os.utime(store.page_path(k), (old, old))
    listing = upkeep.listing

    def listed_then_renewed(root):
        out = listing(root)
        assert upkeep.renew(store.page_path(keys[0]))      # the other process's lookup
        return out

    monkeypatch.setattr(upkeep, "listing", listed_then_renewed)
    assert store.sweep(ttl_s=60, cap_bytes=None, grace_s=30) == [store.page_path(keys[1])]
    assert store.page_path(keys[0]).is_file()
    assert store.sweep(ttl_s=60, cap_bytes=None, grace_s=0) == []   # renewed: not past the TTL
