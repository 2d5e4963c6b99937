"""model.rowwise's Triton kernels (in Triton's interpreter on the CPU, and natively on a GPU
with TRITON_INTERPRET=0) against their eager twins (model.ops): close in bf16 and fp32; each
row's bits the same whatever rows share the call (all rows at once against each block alone,
and against the rows shifted by one; natively, at the 0.8B's heads, 512-row blocks of 1,500
rows too), and bad shapes refused."""
import os

import pytest
import torch

from adapters.model import ops, rowwise

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cpu" if INTERPRETED else "cuda"
pytestmark = pytest.mark.skipif(not INTERPRETED and not torch.cuda.is_available(),
                                reason="Triton's interpreter on the CPU, or a GPU")
ON_CPU = pytest.mark.skipif(not INTERPRETED, reason="the tiny model on the CPU, interpreted")


def _heads(t, h, d, dtype, g):
    """x [t, h, d] as a fused projection's strided column slice (rows 2 h d apart)."""
    wide = torch.randn(t, h, 2 * d, generator=g).to(DEV, dtype)
    return wide[..., :d]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_norm_rope_is_close_to_its_twin_and_row_invariant(dtype, tol):
    g = torch.Generator().manual_seed(0)
    t, h, d, rot = 24, 3, 32, 16
    x = _heads(t, h, d, dtype, g)
    w = torch.randn(d, generator=g).to(DEV, dtype)
    pos = torch.arange(t, dtype=torch.float32)[:, None] * torch.arange(rot // 2) * 0.1
    cos = torch.cat([pos.cos()] * 2, dim=-1).to(DEV, dtype)
    sin = torch.cat([pos.sin()] * 2, dim=-1).to(DEV, dtype)
    y = rowwise.norm_rope(x, w, 1e-6, cos, sin)
    assert y.shape == (t, h, d) and y.dtype == dtype and y.is_contiguous()
    torch.testing.assert_close(y.float(), ops.norm_rope(x, w, 1e-6, cos, sin).float(),
                               atol=tol, rtol=tol)
    for lo, hi in ((0, 8), (8, 16), (5, 24), (23, 24)):
        assert torch.equal(rowwise.norm_rope(x[lo:hi], w, 1e-6, cos[lo:hi], sin[lo:hi]),
                           y[lo:hi])
    with pytest.raises(ValueError, match="norm_rope takes"):
        rowwise.norm_rope(x, w, 1e-6, cos[:, :3], sin[:, :3])


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("hk,hv", [(2, 4), (3, 6)])        # (3, 6): head tiles padded, masked
def test_gdn_gates_are_close_to_their_twin_and_row_invariant(dtype, tol, hk, hv):
    g = torch.Generator().manual_seed(1)
    t, kd, vd = 20, 16, 8
    width = 2 * hk * kd + hv * vd
    wide = torch.randn(t, width + 2 * hv + 3, generator=g).to(DEV, dtype)   # one fused GEMM's out
    mixed, b, a = wide[:, :width], wide[:, width:width + hv], wide[:, width + hv:width + 2 * hv]
    a_log, dt_bias = torch.randn(hv, generator=g).to(DEV), torch.randn(hv, generator=g).to(DEV)
    a = a * 12                                               # softplus past 20 somewhere
    got = rowwise.gdn_gates(mixed, b, a, a_log, dt_bias, hk, kd, hv, vd)
    want = ops.gdn_gates(mixed, b, a, a_log, dt_bias, hk, kd, hv, vd)
    for x, y in zip(got, want):
        assert x.shape == y.shape and x.dtype == y.dtype
        torch.testing.assert_close(x.float(), y.float(), atol=tol, rtol=tol)
    assert got[2].is_contiguous() and got[3].dtype == torch.float32
    for lo, hi in ((0, 7), (7, 20), (3, 4)):
        part = rowwise.gdn_gates(mixed[lo:hi], b[lo:hi], a[lo:hi], a_log, dt_bias, hk, kd, hv,
                                 vd)
        assert all(torch.equal(x, y[lo:hi]) for x, y in zip(part, got))
    with pytest.raises(ValueError, match="gdn_gates takes"):
        rowwise.gdn_gates(mixed[:, 1:], b, a, a_log, dt_bias, hk, kd, hv, vd)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("h", [4, 5])                  # 5: the head tile padded to 8, masked
def test_gated_rms_norm_is_close_to_its_twin_and_row_invariant(dtype, tol, h):
    g = torch.Generator().manual_seed(2)
    t, d = 18, 16
    x = torch.randn(t, h, d, generator=g).to(DEV, dtype)
    z = torch.randn(t, h * d + 5, generator=g).to(DEV, dtype)[:, 5:].reshape(t, h, d)  # a slice
    w = torch.randn(d, generator=g).to(DEV, dtype)
    y = rowwise.gated_rms_norm(x, z, w, 1e-6)
    assert y.shape == (t, h, d) and y.dtype == dtype and y.is_contiguous()
    torch.testing.assert_close(y.float(), ops.gated_rms_norm(x, z, w, 1e-6).float(),
                               atol=tol, rtol=tol)
    for lo, hi in ((0, 9), (9, 18), (4, 5)):
        assert torch.equal(rowwise.gated_rms_norm(x[lo:hi], z[lo:hi], w, 1e-6), y[lo:hi])
    with pytest.raises(ValueError, match="gated_rms_norm takes"):
        rowwise.gated_rms_norm(x, z[:, :2], w, 1e-6)


def test_row_invariant_ops_swap_only_the_three_ops_and_the_down_projection():
    from adapters.model import invariant
    fused = ops.Ops()
    inv = ops.row_invariant_ops(fused)
    assert inv.norm_rope is rowwise.norm_rope and inv.gdn_gates is rowwise.gdn_gates
    assert inv.gated_rms_norm is rowwise.gated_rms_norm
    assert inv.rms_norm is fused.rms_norm and inv.linear is fused.linear
    assert fused.down is None and inv.down.func is invariant.linear_splitk
    assert inv.down.keywords == {"splits": ops.DOWN_SPLITS}
    g = torch.Generator().manual_seed(9)
    x, w = torch.randn(5, 80, generator=g).to(DEV), torch.randn(16, 80, generator=g).to(DEV)
    assert torch.equal(fused.down_proj(x, w), torch.nn.functional.linear(x, w))
    assert torch.equal(inv.down_proj(x, w), invariant.linear_splitk(x, w, ops.DOWN_SPLITS))


def test_the_kernels_take_the_0_8b_heads_row_by_row():
    """The 0.8B's shapes (head_dim 256, rotary 64, 8 and 2 heads; GDN 16 key and value heads
    of 128; the gated norm over the gates' v): a few rows (natively 1,500, and 512-row blocks
    of them), each the same alone as among the others, close to the twins."""
    from adapters.model.config import PRESETS
    cfg = PRESETS["qwen3.5-0.8b"]
    assert rowwise.fits(cfg)
    g = torch.Generator().manual_seed(3)
    t, d, rot = (5 if INTERPRETED else 1500), cfg.head_dim, cfg.rotary_dim
    blocks = [(2, 3), (4, 5)] + ([] if INTERPRETED else [(100, 612), (988, 1500)])

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(DEV)
    cos, sin, w = rand(t, rot), rand(t, rot), rand(d)
    for h in (cfg.num_attention_heads, cfg.num_key_value_heads):
        x = _heads(t, h, d, torch.float32, g)
        y = rowwise.norm_rope(x, w, 1e-6, cos, sin)
        torch.testing.assert_close(y, ops.norm_rope(x, w, 1e-6, cos, sin), atol=1e-5,
                                   rtol=1e-5)
        for lo, hi in blocks:
            assert torch.equal(rowwise.norm_rope(x[lo:hi], w, 1e-6, cos[lo:hi], sin[lo:hi]),
                               y[lo:hi])
    hk, kd = cfg.linear_num_key_heads, cfg.linear_key_head_dim
    hv, vd = cfg.linear_num_value_heads, cfg.linear_value_head_dim
    mixed = rand(t, 2 * hk * kd + hv * vd)
    b, a, a_log, dt_bias = rand(t, hv), rand(t, hv), rand(hv), rand(hv)
    got = rowwise.gdn_gates(mixed, b, a, a_log, dt_bias, hk, kd, hv, vd)
    for x, y in zip(got, ops.gdn_gates(mixed, b, a, a_log, dt_bias, hk, kd, hv, vd)):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    z, w_v = rand(t, hv, vd), rand(vd)
    y = rowwise.gated_rms_norm(got[2], z, w_v, 1e-6)
    torch.testing.assert_close(y, ops.gated_rms_norm(got[2], z, w_v, 1e-6), atol=1e-5,
                               rtol=1e-5)
    for lo, hi in blocks:
        one = rowwise.gdn_gates(mixed[lo:hi], b[lo:hi], a[lo:hi], a_log, dt_bias, hk, kd, hv,
                                vd)
        assert all(torch.equal(x, y_[lo:hi]) for x, y_ in zip(one, got))
        assert torch.equal(rowwise.gated_rms_norm(got[2][lo:hi], z[lo:hi], w_v, 1e-6),
                           y[lo:hi])


def test_bad_inputs_are_refused_with_their_strides():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 2, 8, generator=g)
    cos = sin = torch.randn(3, 4, generator=g)
    with pytest.raises(ValueError, match=r"w \(8,\) strides \(2,\)"):
        rowwise.norm_rope(x, torch.randn(16, generator=g)[::2], 1e-6, cos, sin)
    with pytest.raises(ValueError, match=r"w \(8,\) strides \(2,\)"):
        rowwise.gated_rms_norm(x, x, torch.randn(16, generator=g)[::2], 1e-6)
    mixed, ba = torch.randn(3, 2 * 8 + 2 * 8, generator=g), torch.randn(3, 2, generator=g)
    with pytest.raises(ValueError, match=r"dt_bias \(1,\)"):
        rowwise.gdn_gates(mixed, ba, ba, torch.zeros(2), torch.zeros(1), 1, 8, 2, 8)
    with pytest.raises(ValueError, match=r"b \(3, 2\) strides \(1, 3\)"):
        rowwise.gdn_gates(mixed, ba.t().contiguous().t(), ba, torch.zeros(2), torch.zeros(2),
                          1, 8, 2, 8)


@ON_CPU
def test_a_question_batch_through_the_row_invariant_ops_gives_each_fork_its_bits(tiny,
                                                                                monkeypatch):
    """The question runner below the grid with ops.row_invariant_ops (as on CUDA: here over
    the eager ops, the kernels interpreted) and its batch with every part it can run in one
    call (no FA4 here: the conv, the recurrences, the heads, gates, gated norm and down
    projection over all rows): each fork's hidden rows equal its runner's alone, bit for
    bit."""
    from paged import paged_kv

    from adapters import state_spec
    from adapters.runners.batch import BatchRunner
    from adapters.runners.runners import Runners
    from block_store import PagedKv
    t, grid = 64, 128
    runners = Runners(tiny, grid)
    monkeypatch.setattr(runners, "question_ops", lambda rows: ops.row_invariant_ops(ops.EAGER))
    alone = runners.for_rows(t)
    assert alone is not runners.chunk and alone.ops.norm_rope is rowwise.norm_rope
    assert alone.ops.down is not None
    batch = BatchRunner(alone, runners.batch_slots(2))
    assert batch.calls.parts == ("recurrences", "conv", "rows", "norms")
    spec = state_spec(tiny)
    base = paged_kv(spec, grid, 4 * grid, seed=6)
    g = torch.Generator().manual_seed(6)
    forks = []
    for b in range(2):
        gdn = [(torch.randn(spec.conv_dim, spec.conv_width, generator=g),
                torch.randn(*spec.recurrent_shape, generator=g) * 0.1)
               for _ in range(spec.num_gdn)]
        forks.append((torch.randint(0, 1000, (t,), generator=g).tolist(), grid,
                      PagedKv(base.pool, base.pages[:1] + [base.pages[1 + b]]), gdn))
    for (ids, pos, kv, gdn), h in zip(forks, batch.run(forks)):
        assert torch.equal(h, alone.run(ids, pos, kv, gdn)[0])


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_the_layers_norms_are_close_to_their_twins_and_row_invariant(dtype, tol):
    """rms_norm and add_rms_norm (hidden 48: one block of 64, masked): close to ops' eager
    ones, the norm of add_rms_norm that of its sum, each row the same alone as among
    others."""
    g = torch.Generator().manual_seed(5)
    t, n = 20, 48
    x = torch.randn(t, n + 8, generator=g).to(DEV, dtype)[:, 8:]       # rows strided
    h = torch.randn(t, n, generator=g).to(DEV, dtype)
    w = torch.randn(n, generator=g).to(DEV, dtype)
    y = rowwise.rms_norm(x, w, 1e-6)
    assert y.shape == (t, n) and y.dtype == dtype and y.is_contiguous()
    torch.testing.assert_close(y.float(), ops.rms_norm(x, w, 1e-6).float(), atol=tol, rtol=tol)
    s, yn = rowwise.add_rms_norm(x, h, w, 1e-6)
    want_s, want_n = ops.add_rms_norm(x, h, w, 1e-6)
    assert s.is_contiguous()            # the sum: one rounding (Triton's interpreter rounds
    torch.testing.assert_close(s.float(), want_s.float(), atol=tol, rtol=tol)   # otherwise)
    torch.testing.assert_close(yn.float(), want_n.float(), atol=tol, rtol=tol)
    assert torch.equal(yn, rowwise.rms_norm(s, w, 1e-6))          # the norm of the sum
    for lo, hi in ((0, 8), (8, 20), (3, 4)):
        assert torch.equal(rowwise.rms_norm(x[lo:hi], w, 1e-6), y[lo:hi])
        part = rowwise.add_rms_norm(x[lo:hi], h[lo:hi], w, 1e-6)
        assert torch.equal(part[0], s[lo:hi]) and torch.equal(part[1], yn[lo:hi])
    assert rowwise.rms_norm(x[:0], w, 1e-6).shape == (0, n)
    with pytest.raises(ValueError, match=r"rms_norm takes x \[T, N\].*w \(47,\)"):
        rowwise.rms_norm(x, w[:47], 1e-6)
    with pytest.raises(ValueError, match=r"add_rms_norm takes.*h \(20, 48\) torch.float64"):
        rowwise.add_rms_norm(x, h.double(), w, 1e-6)
    with pytest.raises(ValueError, match=r"strides \(1, 20\)"):        # columns strided
        rowwise.rms_norm(torch.randn(n, t).to(DEV, dtype).t(), w, 1e-6)


def test_rowwise_chunk_ops_swap_the_five_row_wise_reductions():
    fused = ops.Ops()
    chunk = ops.rowwise_chunk_ops(fused)
    assert (chunk.rms_norm, chunk.add_rms_norm, chunk.norm_rope, chunk.gdn_gates,
            chunk.gated_rms_norm) == (rowwise.rms_norm, rowwise.add_rms_norm, rowwise.norm_rope,
                                      rowwise.gdn_gates, rowwise.gated_rms_norm)
    assert chunk.linear is fused.linear and chunk.down is None and chunk.swiglu is fused.swiglu
    assert chunk.sigmoid_gate is fused.sigmoid_gate


@ON_CPU
def test_a_chunk_batch_over_row_invariant_chunk_ops_keeps_every_part_in_one_call(tiny):
    """Runners(row_invariant=True): the chunk runner's row-wise reductions through
    model.rowwise (interpreted here, over the eager ops) and a batch of its grid chunks that
    starts with every part but FA4 in one call (the norms, q/k heads, GDN gates, gated norm,
    conv, recurrences and the down projection over all rows): each chunk's hidden rows,
    states and KV rows equal the chunk runner's alone, bit for bit; the path names the op
    set."""
    from paged import paged_kv

    from adapters import state_spec
    from adapters.runners.batch import CHUNK_WAYS
    from adapters.runners.runners import Runners
    from block_store import PagedKv
    grid = 64
    runners = Runners(tiny, grid, row_invariant=True)
    assert runners.chunk.ops.rms_norm is rowwise.rms_norm and "+rowwise2" in runners.path
    assert "+rowwise" not in Runners(tiny, grid).path
    batch = runners.chunk_batch(2)
    assert batch.calls == CHUNK_WAYS[0] and set(batch.calls.parts) == {
        "recurrences", "conv", "rows", "norms", "down"}
    spec = state_spec(tiny)
    base = paged_kv(spec, grid, 6 * grid, seed=8)
    g = torch.Generator().manual_seed(8)
    items = []
    for pos, pages in ((grid, base.pages[:2]), (3 * grid, base.pages[2:6])):
        gdn = [(torch.randn(spec.conv_dim, spec.conv_width, generator=g),
                torch.randn(*spec.recurrent_shape, generator=g) * 0.1)
               for _ in range(spec.num_gdn)]
        items.append((torch.randint(0, 1000, (grid,), generator=g).tolist(), pos,
                       PagedKv(base.pool, pages), gdn))
    got = batch.read(items)
    rows = [[x[kv.pages[pos // grid]].clone() for pair in kv.pool.layers() for x in pair]
            for _, pos, kv, _ in items]
    for (ids, pos, kv, gdn), (h, states), written in zip(items, got, rows):
        want_h, want_states = runners.chunk.run(ids, pos, kv, gdn)
        assert torch.equal(h, want_h)
        assert all(torch.equal(a, c) and torch.equal(b, d)
                   for (a, b), (c, d) in zip(states, want_states))
        assert all(torch.equal(x, y) for x, y in zip(
            written, [x[kv.pages[pos // grid]] for pair in kv.pool.layers() for x in pair]))
