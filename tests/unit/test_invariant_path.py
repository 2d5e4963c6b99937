"""The 'eager+bi' path (EagerAdapter(invariant=True): every projection through
model.invariant.linear, its twin on the CPU): its name, when it batches, and a batched read
committing each session as read alone, bit for bit, with bits of its own (not 'eager''s)."""
import random

import pytest
import torch
from helpers import vocab_ids

from adapters.eager import EagerAdapter
from adapters.model import batch, invariant
from adapters.model.qwen35 import Qwen35
from shadow_plugin.reader.reader import Reader

G = 64


def _state(reader, sid):
    return reader.state_tensors(sid)


def test_the_path_names_the_invariant_linear_and_the_identity_differs(tiny):
    plain, bi = EagerAdapter(tiny, G), EagerAdapter(tiny, G, invariant=True)
    assert (plain.path, bi.path) == ("eager", "eager+bi")
    assert not plain.invariant and bi.invariant
    assert plain.identity() != bi.identity()                 # spilled files never mixed
    assert "eager+bi" in bi.identity().kernels


def test_on_cuda_only_the_invariant_path_batches_and_checks_once(tiny, monkeypatch):
    """A fake CUDA device (the model's device property): the plain path never batches there
    (cuBLAS picks its kernels by M); the invariant one asks its checks once."""
    monkeypatch.setattr(Qwen35, "device", property(lambda self: torch.device("cuda", 0)))
    plain, bi = EagerAdapter(tiny, G), EagerAdapter(tiny, G, invariant=True)
    calls = []
    monkeypatch.setattr(bi, "_rows_invariant", lambda: calls.append(1) or True)
    monkeypatch.setattr(plain, "_rows_invariant", lambda: pytest.fail("plain checked on CUDA"))
    assert not plain.batches()
    assert bi.batches() and bi.batches() and calls == [1]


def test_the_invariant_checks_hold_on_the_cpu_and_catch_a_norm_that_looks_at_the_batch(tiny):
    assert tiny.rows_invariant(G, linear=invariant.linear)
    assert batch.norm_rows_invariant(tiny.norm, tiny.cfg.hidden_size, G, tiny.dtype,
                                     tiny.device)

    def batch_norm(x):                  # a norm over all rows: each row's bits depend on M
        return (x - x.mean()) / x.std()
    assert not batch.norm_rows_invariant(batch_norm, 16, G, torch.float32, tiny.device)


def test_a_batched_read_on_the_invariant_path_commits_each_session_as_read_alone(tiny,
                                                                                  monkeypatch):
    rng = random.Random(3)
    sizes = [2 * G + 5, G, 3 * G]
    ids = {f"s{i}": vocab_ids(rng, n) for i, n in enumerate(sizes)}
    readers = [Reader(EagerAdapter(tiny, G, invariant=True)) for _ in range(2)]
    plain = Reader(EagerAdapter(tiny, G))
    for r in (*readers, plain):
        for s, x in ids.items():
            r.feed(s, x, "prompt")
    calls = []
    forward_batch = tiny.forward_batch
    monkeypatch.setattr(tiny, "forward_batch",
                        lambda seqs, *a, **k: calls.append((len(seqs), k.get("linear")))
                        or forward_batch(seqs, *a, **k))
    batched, alone = readers
    assert batched.adapter.batches()
    while batched.read_batch(list(ids)).num_chunks:
        pass
    assert calls[0] == (3, invariant.linear)
    differs = False
    for s in ids:
        alone.read(s)
        plain.read(s)
        assert batched.committed(s) == alone.committed(s) == len(ids[s]) // G * G
        a, b, p = _state(batched, s), _state(alone, s), _state(plain, s)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        differs = differs or any(not torch.equal(a[k], p[k]) for k in a)
        assert batched.check_exact(s)
    assert differs                       # the twin's sums are not F.linear's: bits of its own


def test_a_batch_whose_row_counts_change_bits_is_read_one_at_a_time(tiny, monkeypatch):
    """A machine whose GEMMs give rows other bits at some row count (a CPU with AMX did, for
    the 0.8B's shapes): the adapter checks each row count a batch meets once, and a batch that
    meets a bad one runs one forward per sequence (the alone bits), never forward_batch; the
    reader, asking the same, reads one chunk a call."""
    adapter = EagerAdapter(tiny, G)
    asked = []

    def keeps(num_rows, row_tile=batch.ROW_TILE, linear=None):
        asked.append(num_rows)
        return num_rows != 2 * G                  # the buffer of two chunks of G ids
    monkeypatch.setattr(tiny, "gemms_keep_tile_bits", keeps)
    monkeypatch.setattr(tiny, "forward_batch", lambda *a, **k: pytest.fail("batched"))
    assert adapter._keeps_bits([G, G]) is False and sorted(asked) == [G, 2 * G]
    assert adapter._keeps_bits([G - 3, G]) is False and sorted(asked) == [G, 2 * G]  # once
    assert adapter.batches()                      # the coarse check alone would batch
    rng = random.Random(5)
    ids = {"a": vocab_ids(rng, 2 * G), "b": vocab_ids(rng, G)}
    batched, alone = Reader(adapter), Reader(EagerAdapter(tiny, G))
    for r in (batched, alone):
        for sid, x in ids.items():
            r.feed(sid, x, "prompt")
    # not batched: one chunk a call (the reader plans with the same answer), never the batch
    # one at a time in one hold
    assert batched.read_batch(["a", "b"]).sessions == ("a",)
    for sid in ids:
        alone.read(sid)
        batched.read(sid)
        assert batched.committed(sid) == len(ids[sid]) and batched.check_exact(sid)
        got, want = _state(batched, sid), _state(alone, sid)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
