"""model.rowwise's Triton kernels (in Triton's interpreter on the CPU) against their eager
twins (model.ops): close in bf16 and fp32; each row's bits the same whatever rows share the
call (all rows at once against each block alone, and against the rows shifted by one), and
bad shapes refused."""
import os

import pytest
import torch

from adapters.model import ops, rowwise

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="Triton's interpreter on the CPU")


def _heads(t, h, d, dtype, g):
    """x [t, h, d] as a fused projection's strided column slice (rows 2 h d apart)."""
    wide = torch.randn(t, h, 2 * d, generator=g).to(dtype)
    return wide[..., :d]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_norm_rope_is_close_to_its_twin_and_row_invariant(dtype, tol):
    g = torch.Generator().manual_seed(0)
    t, h, d, rot = 24, 3, 32, 16
    x = _heads(t, h, d, dtype, g)
    w = torch.randn(d, generator=g).to(dtype)
    pos = torch.arange(t, dtype=torch.float32)[:, None] * torch.arange(rot // 2) * 0.1
    cos = torch.cat([pos.cos()] * 2, dim=-1).to(dtype)
    sin = torch.cat([pos.sin()] * 2, dim=-1).to(dtype)
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
def test_gdn_gates_are_close_to_their_twin_and_row_invariant(dtype, tol):
    g = torch.Generator().manual_seed(1)
    t, hk, kd, hv, vd = 20, 2, 16, 4, 8
    width = 2 * hk * kd + hv * vd
    wide = torch.randn(t, width + 2 * hv + 3, generator=g).to(dtype)   # one fused GEMM's out
    mixed, b, a = wide[:, :width], wide[:, width:width + hv], wide[:, width + hv:width + 2 * hv]
    a_log, dt_bias = torch.randn(hv, generator=g), torch.randn(hv, generator=g)
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
def test_gated_rms_norm_is_close_to_its_twin_and_row_invariant(dtype, tol):
    g = torch.Generator().manual_seed(2)
    t, h, d = 18, 4, 16
    x = torch.randn(t, h, d, generator=g).to(dtype)
    z = torch.randn(t, h * d + 5, generator=g).to(dtype)[:, 5:].reshape(t, h, d)  # a slice
    w = torch.randn(d, generator=g).to(dtype)
    y = rowwise.gated_rms_norm(x, z, w, 1e-6)
    assert y.shape == (t, h, d) and y.dtype == dtype and y.is_contiguous()
    torch.testing.assert_close(y.float(), ops.gated_rms_norm(x, z, w, 1e-6).float(),
                               atol=tol, rtol=tol)
    for lo, hi in ((0, 9), (9, 18), (4, 5)):
        assert torch.equal(rowwise.gated_rms_norm(x[lo:hi], z[lo:hi], w, 1e-6), y[lo:hi])
    with pytest.raises(ValueError, match="gated_rms_norm takes"):
        rowwise.gated_rms_norm(x, z[:, :2], w, 1e-6)


def test_row_invariant_ops_swap_only_the_three_ops():
    fused = ops.Ops()
    inv = ops.row_invariant_ops(fused)
    assert inv.norm_rope is rowwise.norm_rope and inv.gdn_gates is rowwise.gdn_gates
    assert inv.gated_rms_norm is rowwise.gated_rms_norm
    assert inv.rms_norm is fused.rms_norm and inv.linear is fused.linear
