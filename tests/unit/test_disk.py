"""The content-addressed disk tier (block_store/disk/store.py): pages and GDN entries by key,
written once, found by key from another store on the same folder; manifests; every file that
does not fit refused with its reason."""
import os

import pytest
import torch
from helpers import DISK_IDENT, DISK_ROOT, disk_page

from block_store import FileIdentity, RefusedFile
from block_store.disk.store import DiskStore, Manifest
from block_store.memory.keys import page_keys


def test_pages_and_entries_round_trip_and_are_written_once(tmp_path):
    ids = list(range(100, 164))
    key = page_keys(DISK_ROOT, ids, 64)[0]
    store = DiskStore(tmp_path, DISK_IDENT)
    kv = disk_page(0)
    assert not store.has_page(key) and store.write_page(key, ids, kv)
    old = 1_000_000_000
    os.utime(store.page_path(key), (old, old))
    assert not store.write_page(key, ids, disk_page(1))         # its content is its key's: kept
    assert store.page_path(key).stat().st_mtime > old       # used: its TTL starts again
    other = DiskStore(tmp_path, DISK_IDENT)                       # another reader on the folder
    assert torch.equal(other.read_page(key, ids), kv)
    states = [(torch.randn(6, 4), torch.randn(2, 3, 3)) for _ in range(3)]
    assert store.write_entry(key, 64, states, "shared")
    line, back, kind = other.read_entry(key)
    assert (line, kind) == (64, "shared")
    assert all(torch.equal(a, b) for p, q in zip(back, states) for a, b in zip(p, q))




def test_files_that_do_not_fit_are_refused_with_the_reason(tmp_path):
    ids = list(range(64))
    key = page_keys(DISK_ROOT, ids, 64)[0]
    store = DiskStore(tmp_path, DISK_IDENT)
    store.write_page(key, ids, disk_page(3))
    with pytest.raises(RefusedFile) as e:
        store.read_page(key, list(range(1, 65)))
    assert e.value.reason == "ids"
    with pytest.raises(RefusedFile) as e:
        DiskStore(tmp_path, FileIdentity("other", "{}", 64, "float32", "cpu",
                                         "torch eager")).read_page(key, ids)
    assert e.value.reason == "fingerprint"
    with pytest.raises(RefusedFile) as e:
        store.read_page(page_keys(DISK_ROOT, list(range(1, 65)), 64)[0], list(range(1, 65)))
    assert e.value.reason == "missing"
    path = store.page_path(key)
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0xFF                                        # a flipped bit in the last tensor
    path.write_bytes(bytes(raw))
    with pytest.raises(RefusedFile) as e:
        store.read_page(key, ids)
    assert e.value.reason == "checksum"
    path.write_bytes(bytes(raw[:100]))                      # truncated
    with pytest.raises(RefusedFile) as e:
        store.read_page(key, ids)
    assert e.value.reason == "unreadable"


def test_manifests_round_trip_and_refuse_what_does_not_fit(tmp_path):
    store = DiskStore(tmp_path, DISK_IDENT)
    ids = list(range(200))
    keys = [k.hex() for k in page_keys(DISK_ROOT, ids, 64)[:2]]
    m = Manifest(ids, 128, keys, keys[-1], [(64, keys[0], True, False)], {192: False}, 64)
    store.write_manifest("s/1", m)
    back = store.read_manifest("s/1")
    assert (back.ids, back.committed, back.page_keys, back.state_key, back.checkpoints,
            back.pending_lines, back.shared_line) == (ids, 128, keys, keys[-1],
                                                      [(64, keys[0], True, False)], {192: False},
                                                      64)
    assert back.written_at > 0 and "s/1" not in str(store.manifest_path("s/1"))
    assert back.mark == (store.writer, 1)
    store.write_manifest("s/1", Manifest(ids, 0, [], None), back.mark)     # replaced
    assert store.read_manifest("s/1").committed == 0
    store.write_manifest("bad", Manifest(ids, 128, keys[:1], keys[0]))
    with pytest.raises(RefusedFile) as e:
        store.read_manifest("bad")
    assert e.value.reason == "manifest"
    with pytest.raises(RefusedFile) as e:
        store.read_manifest("nobody")
    assert e.value.reason == "missing"


def test_sweep_takes_expired_files_then_the_oldest_pages_before_manifests(tmp_path):
    store = DiskStore(tmp_path, DISK_IDENT)
    ids = list(range(256))
    keys = page_keys(DISK_ROOT, ids, 64)
    for i, k in enumerate(keys):
        store.write_page(k, ids[i * 64:(i + 1) * 64], disk_page(i))
    states = [(torch.randn(6, 4), torch.randn(2, 3, 3))]
    store.write_entry(keys[-1], 256, states, "state")
    man = store.write_manifest("s", Manifest(ids, 256, [k.hex() for k in keys], keys[-1].hex()))
    now = 2_000_000_000
    for age, path in enumerate([man, store.entry_path(keys[-1])] +
                               [store.page_path(k) for k in keys]):
        os.utime(path, (now - 10 * age, now - 10 * age))   # the manifest oldest of all but
    os.utime(man, (now - 1000, now - 1000))                 # manifests go last past the cap
    os.utime(store.page_path(keys[0]), (now - 10 ** 6, now - 10 ** 6))   # expired
    page_bytes = store.page_path(keys[1]).stat().st_size
    total = store.counts()["bytes"]
    gone = store.sweep(ttl_s=10 ** 5, cap_bytes=total - page_bytes - 1)
    # pages[0] expired; then the oldest other page (pages[3], 50 s old) for the cap
    assert gone == [store.page_path(keys[0]), store.page_path(keys[3])]
    assert store.counts() == {"pages": 2, "gdn_entries": 1, "manifests": 1,
                              "bytes": total - 2 * page_bytes}
    gone = store.sweep(ttl_s=10 ** 9, cap_bytes=0, keep={man})
    assert man.is_file() and store.counts()["pages"] == 0 and store.counts()["gdn_entries"] == 0


def test_refused_files_are_set_aside_and_counted_and_dead_writers_temporaries_removed(tmp_path):
    store = DiskStore(tmp_path, DISK_IDENT)
    ids = list(range(64))
    key = page_keys(DISK_ROOT, ids, 64)[0]
    store.write_page(key, ids, disk_page(4))
    with pytest.raises(RefusedFile) as e:
        store.read_page(key, list(range(1, 65)))
    assert e.value.path == store.page_path(key)
    store.set_aside(e.value.path, e.value.reason)
    store.set_aside(e.value.path, e.value.reason)          # gone already: not counted again
    assert store.refusals == {"ids": 1} and not store.has_page(key)
    assert [p.name.split(".")[2] for p in (tmp_path / "refused").iterdir()] == ["ids"]
    dead = tmp_path / "pages" / ".x.safetensors.999999999-1.tmp"      # no such process
    live = tmp_path / "pages" / f".y.safetensors.{os.getpid()}-1.tmp"
    dead.write_bytes(b"x")
    live.write_bytes(b"x")
    DiskStore(tmp_path, DISK_IDENT)
    assert not dead.exists() and live.exists()
