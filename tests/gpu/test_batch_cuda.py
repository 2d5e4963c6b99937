"""The 'eager+bi' path on CUDA (skipped without one): a batched read commits each session as
read alone, bit for bit, and the invariant linear's rows keep their bits across row counts at
the 0.8B's projection shapes (where cuBLAS's need not)."""
import random

import pytest
import torch
from helpers import vocab_ids

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device")
G = 512


@pytest.fixture(scope="module")
def model():
    from adapters.model import load_model
    return load_model("random:qwen3.5-0.8b", device="cuda")


def test_the_invariant_linear_keeps_a_rows_bits_at_the_model_shapes(model):
    from adapters.model import invariant
    for w in (model.layers[0].mlp.gate_proj.weight, model.layers[0].mlp.down_proj.weight,
              model.layers[3].self_attn.q_proj.weight):
        x = torch.randn(4096, w.shape[1], device="cuda").to(w.dtype)
        big = invariant.linear(x, w)
        for m in (1, 3, 17, 512, 1024, 2048):
            assert torch.equal(invariant.linear(x[:m], w), big[:m]), (tuple(w.shape), m)
        want = x.double() @ w.double().t()
        assert ((big.double() - want).abs() / want.abs().clamp_min(1)).max().item() < 2e-2


def test_a_batched_read_on_cuda_commits_each_session_as_read_alone(model):
    from adapters.eager import EagerAdapter
    from shadow_plugin.reader.reader import Reader
    rng = random.Random(5)
    ids = {f"s{i}": vocab_ids(rng, n) for i, n in enumerate([3 * G, 2 * G + 7, 4 * G])}
    batched, alone = (Reader(EagerAdapter(model, G, invariant=True)) for _ in range(2))
    assert batched.adapter.path == "eager+bi" and batched.adapter.batches()
    for r in (batched, alone):
        for s, x in ids.items():
            r.feed(s, x, "prompt")
    while batched.read_batch(list(ids)).num_chunks:
        pass
    for s in ids:
        alone.read(s)
        a, b = batched.state_tensors(s), alone.state_tensors(s)
        assert batched.committed(s) == alone.committed(s) == len(ids[s]) // G * G
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), s
    assert batched.check_exact("s0")
