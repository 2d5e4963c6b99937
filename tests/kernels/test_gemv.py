"""model.gemv (the fork decode runner's single-row projections, Triton; run by Triton's
interpreter on the CPU) against its twin F.linear, at the decode shapes' proportions and at
lengths the tiling does not divide. Skipped where triton is not installed."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

from adapters.model import gemv  # noqa: E402


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="CPU tensors for Triton's interpreter")
@pytest.mark.parametrize("n,k", [(64, 32), (37, 100), (2100, 96), (8, 1030)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gemv_matches_its_twin(n, k, dtype):
    g = torch.Generator().manual_seed(n * 7 + k)
    x = torch.randn(1, k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)
    got = gemv.gemv(x, w)
    want = F.linear(x.double(), w.double())
    assert got.shape == (1, n) and got.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 2e-3
    assert ((got.double() - want).abs() / want.abs().clamp_min(1)).max().item() < tol
    assert torch.equal(got, gemv.gemv(x, w))                  # one fixed order: same bits


def test_gemv_refuses_other_shapes_and_linear_falls_back_off_cuda():
    x, w = torch.randn(2, 16), torch.randn(8, 16)
    with pytest.raises(ValueError, match=r"x \[1, K\] and w \[N, K\]"):
        gemv.gemv(x, w)
    with pytest.raises(ValueError, match="contiguous"):
        gemv.gemv(x[:1], w.t().contiguous().t())
    assert torch.equal(gemv.linear(x[:1], w), F.linear(x[:1], w))   # the CPU: F.linear itself
