"""The content-addressed disk tier (block_store/disk.py): pages and GDN entries by key, written
once, found by key from another store on the same folder; manifests; every file that does not
fit refused with its reason."""
import os
import subprocess
import sys

import pytest
import torch

from block_store import FileIdentity, RefusedFile
from block_store.disk import DiskStore, Manifest
from block_store.keys import identity_key, page_keys

IDENT = FileIdentity("fp", "{}", 64, "float32", "cpu", "torch eager")
ROOT = identity_key(IDENT.as_meta())


def _page(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 64, 2, 8, generator=g), torch.randn(2, 64, 2, 8, generator=g)


def test_pages_and_entries_round_trip_and_are_written_once(tmp_path):
    ids = list(range(100, 164))
    key = page_keys(ROOT, ids, 64)[0]
    store = DiskStore(tmp_path, IDENT)
    k, v = _page(0)
    assert not store.has_page(key) and store.write_page(key, ids, k, v)
    mtime = store.page_path(key).stat().st_mtime_ns
    assert not store.write_page(key, ids, *_page(1))        # its content is its key's: kept
    assert store.page_path(key).stat().st_mtime_ns == mtime
    other = DiskStore(tmp_path, IDENT)                       # another reader on the folder
    got_k, got_v = other.read_page(key, ids)
    assert torch.equal(got_k, k) and torch.equal(got_v, v)
    states = [(torch.randn(6, 4), torch.randn(2, 3, 3)) for _ in range(3)]
    assert store.write_entry(key, 64, states, "shared")
    line, back, kind = other.read_entry(key)
    assert (line, kind) == (64, "shared")
    assert all(torch.equal(a, b) for p, q in zip(back, states) for a, b in zip(p, q))


def test_the_same_keys_in_another_process(tmp_path):
    """Another process (another hash seed) computes the same key, so finds the page."""
    ids = list(range(7, 71))
    DiskStore(tmp_path, IDENT).write_page(page_keys(ROOT, ids, 64)[0], ids, *_page(2))
    code = ("import sys; from block_store.disk import DiskStore; from block_store.keys import "
            "identity_key, page_keys; from block_store import FileIdentity; "
            "i = FileIdentity('fp', '{}', 64, 'float32', 'cpu', 'torch eager'); "
            "ids = list(range(7, 71)); k = page_keys(identity_key(i.as_meta()), ids, 64)[0]; "
            "DiskStore(sys.argv[1], i).read_page(k, ids); print('found')")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "found"


def test_files_that_do_not_fit_are_refused_with_the_reason(tmp_path):
    ids = list(range(64))
    key = page_keys(ROOT, ids, 64)[0]
    store = DiskStore(tmp_path, IDENT)
    store.write_page(key, ids, *_page(3))
    with pytest.raises(RefusedFile) as e:
        store.read_page(key, list(range(1, 65)))
    assert e.value.reason == "ids"
    with pytest.raises(RefusedFile) as e:
        DiskStore(tmp_path, FileIdentity("other", "{}", 64, "float32", "cpu",
                                         "torch eager")).read_page(key, ids)
    assert e.value.reason == "fingerprint"
    with pytest.raises(RefusedFile) as e:
        store.read_page(page_keys(ROOT, list(range(1, 65)), 64)[0], list(range(1, 65)))
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
    store = DiskStore(tmp_path, IDENT)
    ids = list(range(200))
    keys = [k.hex() for k in page_keys(ROOT, ids, 64)[:2]]
    m = Manifest(ids, 128, keys, keys[-1], [(64, keys[0], True, False)], {192: False}, 64)
    store.write_manifest("s/1", m)
    back = store.read_manifest("s/1")
    assert (back.ids, back.committed, back.page_keys, back.state_key, back.checkpoints,
            back.pending_lines, back.shared_line) == (ids, 128, keys, keys[-1],
                                                      [(64, keys[0], True, False)], {192: False},
                                                      64)
    assert back.written_at > 0 and "s/1" not in str(store.manifest_path("s/1"))
    store.write_manifest("s/1", Manifest(ids, 0, [], None))          # replaced
    assert store.read_manifest("s/1").committed == 0
    store.write_manifest("bad", Manifest(ids, 128, keys[:1], keys[0]))
    with pytest.raises(RefusedFile) as e:
        store.read_manifest("bad")
    assert e.value.reason == "manifest"
    with pytest.raises(RefusedFile) as e:
        store.read_manifest("nobody")
    assert e.value.reason == "missing"
