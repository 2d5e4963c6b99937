"""The fast read of a page file (block_store/disk/page_read.py) against its slow twin
(DiskStore.read_page, safetensors' read): the same bits from a good file and the same refusal,
with the same reason, from every damaged one; and a restore through either gives the same
pool bits and an exact session."""
import json
import random
import struct

import pytest
import torch
from safetensors.torch import save_file

from block_store import FileIdentity, RefusedFile, disk_io
from block_store.disk.files import checksum
from block_store.disk.page_read import _HASH, HASHES, read_page_into
from block_store.disk.store import DiskStore, _meta_checksum
from block_store.memory.keys import identity_key, page_keys
from block_store.pages import find_resume
from shadow_plugin.reader.reader import Reader

IDENT = FileIdentity("fp", "{}", 64, "bfloat16", "cpu", "torch eager")
IDS = list(range(100, 164))
KEY = page_keys(identity_key(IDENT.as_meta()), IDS, 64)[0]
SHAPE = (2, 2, 64, 2, 8)


def _kv(seed=0):
    return torch.randn(*SHAPE, generator=torch.Generator().manual_seed(seed)).bfloat16()


def _resave(path, **changes):
    """The file again with metadata fields changed and its metadata checksum made to fit
    (a damage only the later checks can catch)."""
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    meta.update(changes)
    meta["meta_checksum"] = _meta_checksum(meta)
    save_file(tensors, str(path), metadata=meta)


def _header_len(raw):
    return struct.unpack("<Q", raw[:8])[0]


def _flip(at):
    def damage(path):
        raw = bytearray(path.read_bytes())
        raw[at(raw)] ^= 0xFF
        path.write_bytes(bytes(raw))
    return damage


def _cut(n):
    return lambda path: path.write_bytes(path.read_bytes()[:n])


def _other_key(path):
    other = page_keys(identity_key(IDENT.as_meta()), [1] * 64, 64)[0]
    store = DiskStore(path.parent.parent, IDENT)
    store.write_page(other, [1] * 64, _kv(1))
    store.page_path(other).replace(path)


DAMAGES = {
    "none": None,
    "missing": lambda path: path.unlink(),
    "last byte": _flip(lambda raw: len(raw) - 5),
    "first data byte": _flip(lambda raw: 8 + _header_len(raw)),
    "metadata byte": _flip(lambda raw: 8 + _header_len(raw) // 2),
    "header length": _flip(lambda raw: 6),
    "truncated 100": _cut(100),
    "truncated 1": _cut(-1),
    "a byte more": lambda path: path.write_bytes(path.read_bytes() + b"\0"),
    "empty": _cut(0),
    "checksums": lambda path: _resave(path, checksums=json.dumps({"kv": "0", "ids": "1"})),
    "format": lambda path: _resave(path, format="shadow-disk/0"),
    "kind": lambda path: _resave(path, kind="gdn"),
    "grid": lambda path: _resave(path, grid="128"),
    "layout": lambda path: _resave(path, layout="[]"),
    "layout json": lambda path: _resave(path, layout="{"),
    "key": lambda path: _resave(path, key="00"),
    "another page": _other_key,
}


def _slow(store, ids):
    return store.read_page(KEY, ids)


def _fast(store, ids, hash_=None):
    out = torch.empty(SHAPE, dtype=torch.bfloat16)
    read_page_into(store, KEY, ids, out, hash_)
    return out


@pytest.mark.parametrize("hash_", HASHES)
def test_both_hashes_give_the_files_checksums(hash_):
    for t in (_kv(3), torch.arange(64), torch.empty(0)):
        assert _HASH[hash_](t.view(torch.uint8).numpy()) == checksum(t)


@pytest.mark.parametrize("hash_", HASHES)
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_the_fast_read_gives_the_slow_reads_bits_or_its_refusal(tmp_path, damage, hash_):
    store = DiskStore(tmp_path, IDENT)
    kv = _kv()
    store.write_page(KEY, IDS, kv)
    if DAMAGES[damage]:
        DAMAGES[damage](store.page_path(KEY))
    got = {}
    for name, read in (("slow", _slow), ("fast", lambda s, i: _fast(s, i, hash_))):
        try:
            got[name] = read(store, IDS)
        except RefusedFile as e:
            assert e.path == store.page_path(KEY)
            got[name] = e.reason
    if damage == "none":
        assert torch.equal(got["slow"], kv) and torch.equal(got["fast"], kv)
    else:
        assert isinstance(got["slow"], str) and got["fast"] == got["slow"], got


def test_the_fast_read_refuses_other_ids_and_another_identity_as_the_slow_one(tmp_path):
    store = DiskStore(tmp_path, IDENT)
    store.write_page(KEY, IDS, _kv())
    other = DiskStore(tmp_path, FileIdentity("other", "{}", 64, "bfloat16", "cpu",
                                             "torch eager"))
    for store_, ids, reason in ((store, IDS[1:] + [0], "ids"), (other, IDS, "fingerprint")):
        for read in (_slow, _fast):
            with pytest.raises(RefusedFile) as e:
                read(store_, ids)
            assert e.value.reason == reason


def test_the_fast_read_refuses_a_buffer_of_another_shape(tmp_path):
    store = DiskStore(tmp_path, IDENT)
    store.write_page(KEY, IDS, _kv())
    with pytest.raises(RefusedFile) as e:
        read_page_into(store, KEY, IDS, torch.empty(2, 2, 32, 2, 8, dtype=torch.bfloat16))
    assert e.value.reason == "unreadable"


def test_a_restore_through_either_read_gives_the_same_pool_bits(tiny, tmp_path):
    """A parked session's pages forgotten, then loaded by load_resume with the fast read and
    with the slow one: the same pages' bits, and the session exact."""
    rng = random.Random(5)
    r = Reader(tiny, grid=64, max_checkpoints=2, disk_dir=tmp_path)
    ids = [rng.randrange(1000, 240000) for _ in range(5 * 64 + 7)]
    r.feed("a", ids, "prompt")
    r.read("a")
    table = r.table
    table.park("a")
    store, got = table.store, {}
    prompt = ids[:5 * 64]
    for fast in (False, True):
        store.manager.forget_cached()
        store.gdn.evict(0)
        res = find_resume(store, [], [], 0, prompt, 0)
        assert res.num_disk_pages == 5
        res = disk_io.load_resume(store, res, prompt, fast=fast)
        assert res is not None and res.num_loaded == 5
        idx = torch.tensor([p.index for p in res.pages])
        got[fast] = store.pool.block.index_select(2, idx).clone()
    assert torch.equal(got[False], got[True])
    assert r.check_exact("a")
