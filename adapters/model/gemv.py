"""One row times a weight matrix (y = x W^T, x [1, K], W [N, K]) for fork decode steps: a
memory-bound Triton kernel, fixed tiling, fp32 sums; its twin is F.linear.

Why: a decode step reads the whole model's weights for one token, and cuBLAS's kernels for a
single row read them at about 1.3 TB/s on the H200 (the decode profile of
evals/chunk_timeline.py at cadb457, docs/chunk-timeline-2026-11-29-2.log: their kernels took
about 0.7 ms of a 2.08 ms step at 96k context), well under the memory's speed;
evals/gemv_probe.py at cadb457 times each shape against this kernel
(docs/gemv-probe-2026-11-29.log). Each program here reads BLOCK_N whole rows of W once, with x
held in registers, and reduces them in one fixed order (deterministic, the same bits in every
process; other bits than cuBLAS's, so it is used only where no committed state depends on it:
the single-token decode runner of forks, runners.runners).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except ImportError:                       # the CPU install: F.linear only
    triton = None


if triton is not None:
    @triton.jit
    def _gemv_kernel(X, W, Y, N, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """Rows [pid * BLOCK_N, +BLOCK_N) of y: sum over K of W[n, k] * x[k] in fp32."""
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            w = tl.load(W + rows[:, None] * K + cols[None, :],
                        mask=(rows[:, None] < N) & (cols[None, :] < K), other=0.0)
            x = tl.load(X + cols, mask=cols < K, other=0.0)
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        tl.store(Y + rows, tl.sum(acc, axis=1).to(Y.dtype.element_ty), mask=rows < N)


def tiling(n: int, k: int) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_K) for W [n, k]: at least ~512 programs for short outputs (N = 1024
    rows would leave most of 132 SMs idle at 8 rows a program), K in tiles of up to 512."""
    block_n = 2 if n <= 2048 else 8
    return block_n, min(512, triton.next_power_of_2(k))


def gemv(x: torch.Tensor, w: torch.Tensor, tile: tuple[int, int, int] | None = None
         ) -> torch.Tensor:
    """x [1, K] (contiguous) @ w [N, K]^T (contiguous) -> [1, N] in x's dtype, fp32 sums.
    tile: (BLOCK_N, BLOCK_K, num_warps) instead of `tiling`'s (evals/gemv_probe.py at cadb457).
    Raises ValueError for other shapes or layouts."""
    if x.dim() != 2 or x.shape[0] != 1 or w.dim() != 2 or x.shape[1] != w.shape[1] \
            or not (x.is_contiguous() and w.is_contiguous()):
        raise ValueError(f"gemv takes x [1, K] and w [N, K], both contiguous; got "
                         f"{tuple(x.shape)} and {tuple(w.shape)}")
    n, k = w.shape
    y = torch.empty(1, n, device=x.device, dtype=x.dtype)
    block_n, block_k, warps = tile or (*tiling(n, k), 4)
    _gemv_kernel[(triton.cdiv(n, block_n),)](x, w, y, n, K=k, BLOCK_N=block_n, BLOCK_K=block_k,
                                             num_warps=warps)
    return y


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """F.linear(x, w) with a single row through `gemv` where Triton runs (any other shape, and
    the CPU, through F.linear). x [T, K], w [N, K] -> [T, N]."""
    if x.shape[0] == 1 and triton is not None and x.is_cuda and x.is_contiguous() \
            and w.is_contiguous():
        return gemv(x, w)
    return F.linear(x, w)
