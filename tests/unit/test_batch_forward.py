"""Qwen35.forward_batch against its pure-torch twin, each sequence's own forward: hidden rows,
new GDN states and the KV rows written, bit for bit, for random batches (sizes, lengths,
positions, prefixes, page orders in one shared pool); chunks batched give the alone read's bits
(forward without a row tile)."""
import random

import pytest
import torch
from helpers import torch_threads  # noqa: E402

from adapters import spec_for
from adapters.model.config import PRESETS
from adapters.model.qwen35 import ModelInfo
from adapters.model.weights import build_model
from block_store import KvPool, PagedKv


def _batch(model, lengths, positions, seed):
    """Per sequence (ids, pos, kv, gdn) in one shared pool of 64-row pages, each sequence's
    pages at random among the pool's (prefix rows and spare pages noise), random GDN states;
    and a second pool with the same contents for the twin."""
    spec = spec_for(model.cfg, model.device, model.dtype)
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    need = [-(-(p + t) // 64) for p, t in zip(positions, lengths)]
    pool = KvPool(spec, 64, sum(need) + 2)
    pool.block.copy_(torch.randn(pool.block.shape, generator=g).to(pool.block.dtype))
    order = list(range(sum(need) + 2))
    rng.shuffle(order)
    for _ in range(sum(need)):
        pool.manager.allocate()
    twin = KvPool(spec, 64, sum(need) + 2)
    twin.block.copy_(pool.block)
    seqs, twins, at = [], [], 0
    for t, p, n in zip(lengths, positions, need):
        ids = torch.tensor([rng.randrange(248320) for _ in range(t)])
        gdn = [((torch.randn(spec.conv_dim, spec.conv_width, generator=g)).to(model.dtype),
                torch.randn(*spec.recurrent_shape, generator=g) * 0.1)
               for _ in range(spec.num_gdn)]
        pages = order[at:at + n]
        at += n
        seqs.append((ids, p, PagedKv(pool, pages), gdn))
        twins.append((ids, p, PagedKv(twin, pages), gdn))
    return seqs, twins, pool, twin


def _same_states(a, b):
    return all(torch.equal(x, y) for p, q in zip(a, b) for x, y in zip(p, q))


@pytest.mark.parametrize("seed", range(8))
def test_batched_forward_equals_each_sequence_alone(tiny, seed):
    rng = random.Random(seed)
    b = rng.randint(1, 5)
    lengths = [rng.choice([1, 2, 3, 5, 11, 63, 64, 65, 128, rng.randint(1, 200)])
               for _ in range(b)]
    positions = [rng.choice([0, 64, rng.randint(0, 300)]) for _ in range(b)]
    seqs, twins, pool, twin = _batch(tiny, lengths, positions, seed)
    before = [[(c.clone(), r.clone()) for c, r in s[3]] for s in seqs]
    hidden, states = tiny.forward_batch(seqs)
    for (ids, pos, kv, gdn), h, s in zip(twins, hidden, states):
        h2, s2 = tiny.forward(ids, pos, kv, gdn, row_tile=64)
        assert h.shape == (len(ids), tiny.cfg.hidden_size)
        assert torch.equal(h, h2) and _same_states(s, s2)
    assert torch.equal(pool.block, twin.block)            # the KV rows written, and no other
    assert all(_same_states(s[3], b) for s, b in zip(seqs, before))   # inputs not modified


def test_a_row_tile_changes_nothing_for_chunks(tiny):
    """For a length that is a multiple of the tile (a grid chunk) forward with the row tile
    is forward itself; so batched chunks give the alone read's bits."""
    seqs, twins, pool, twin = _batch(tiny, [64, 128, 64], [0, 192, 64], 3)
    hidden, states = tiny.forward_batch(seqs)
    for (ids, pos, kv, gdn), h, s in zip(twins, hidden, states):
        h2, s2 = tiny.forward(ids, pos, kv, gdn)
        assert torch.equal(h, h2) and _same_states(s, s2)
    assert torch.equal(pool.block, twin.block)
    assert tiny.rows_invariant(64)


def test_three_threads_keep_the_batched_bits(tiny):
    """SiLU over a concatenation gave other bits with 3 threads (adapters.model.batch): the
    batched forward runs it per sequence, so its rows keep their bits."""
    with torch_threads(3):
        seqs, twins, pool, twin = _batch(tiny, [500, 450, 330, 200], [0, 70, 5, 64], 4)
        hidden, states = tiny.forward_batch(seqs)
        for (ids, pos, kv, gdn), h, s in zip(twins, hidden, states):
            h2, s2 = tiny.forward(ids, pos, kv, gdn, row_tile=64)
            assert torch.equal(h, h2) and _same_states(s, s2)
        assert torch.equal(pool.block, twin.block)


def test_bf16_batched_forward_equals_alone(tiny_tensors):
    model = build_model(PRESETS["tiny"], tiny_tensors, ModelInfo("tiny", "", True),
                        dtype=torch.bfloat16)
    seqs, twins, pool, twin = _batch(model, [64, 37, 130], [0, 64, 10], 5)
    hidden, states = model.forward_batch(seqs)
    for (ids, pos, kv, gdn), h, s in zip(twins, hidden, states):
        h2, s2 = model.forward(ids, pos, kv, gdn, row_tile=64)
        assert torch.equal(h, h2) and _same_states(s, s2)
    assert torch.equal(pool.block, twin.block)


def test_forward_batch_refuses_an_empty_batch_or_sequence(tiny):
    seqs, *_ = _batch(tiny, [3], [0], 6)
    with pytest.raises(ValueError, match="at least one row"):
        tiny.forward_batch([])
    with pytest.raises(ValueError, match="at least one row"):
        tiny.forward_batch([(seqs[0][0][:0], 0, seqs[0][2], seqs[0][3])])
