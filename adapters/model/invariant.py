"""A batch-invariant linear, y = x W^T (x [M, K], W [N, K]): each output row's bits depend only
on that row of x and on W, never on M, on the row's offset or on the other rows (issue 36's
batched read on CUDA, where cuBLAS picks its kernel and split-K by M, so a row read in a batch
of B chunks would get other bits than alone).

The fast path is a Triton kernel with one fixed tile (`TILE`: BLOCK_M x BLOCK_N output tiles, K
in BLOCK_K steps in one fixed order, no split-K), bf16/fp16 in (fp32 too, with full-precision
dots: the tiny CPU model in Triton's interpreter), fp32 sums, the input's dtype out; M is not
specialized on (one compiled kernel for every row count), so a row meets the same instructions
in the same order whatever else is in the GEMM. Its bits are other than cuBLAS's: a reader whose
committed state goes through it reads every chunk through it, alone or batched
(adapters.eager.EagerAdapter(invariant=True), path 'eager+bi'). Changing `TILE` changes the
bits: give the path another name then.

The slow twin (`linear_twin`) sums the same K blocks in the same order in fp32 with elementwise
torch ops only (the products of bf16 or fp16 values are exact in fp32; within a block k runs
in order), so it is row-invariant by construction on any device; it is close to the kernel
(whose tensor-core sums within a block run in the hardware's order), not equal to it.

Triton is imported only when the kernel first runs (`_kernel`); the CPU install has none.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tile:
    """The kernel's fixed tiling: output tiles block_m x block_n, K in block_k steps; num_warps
    and num_stages (the pipeline's depth: speed only, the same sums)."""

    block_m: int = 64
    block_n: int = 128
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"Tile.{name} must be a power of two >= 16, got {v}")

    @classmethod
    def parse(cls, text: str) -> Tile:
        """'64x128x64' or '64x128x64x4x3' (block_m x block_n x block_k [x warps x stages])."""
        try:
            return cls(*(int(v) for v in text.split("x")))
        except (TypeError, ValueError) as e:
            raise ValueError(f"a tile is BMxBNxBK[xWARPSxSTAGES], got {text!r}: {e}") from None


TILE = Tile()
DTYPES = (torch.bfloat16, torch.float16)
# the kernels take fp32 too (full-precision dots: the tiny CPU model in Triton's interpreter)
KERNEL_DTYPES = DTYPES + (torch.float32,)


def _check(x: torch.Tensor, w: torch.Tensor, dtypes: tuple) -> None:
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"the invariant linear takes x [M, K] and w [N, K], got "
                         f"{tuple(x.shape)} and {tuple(w.shape)}")
    if x.dtype != w.dtype or x.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"the invariant linear takes x and w of one dtype ({names}), got "
                         f"{x.dtype} and {w.dtype}")


@functools.cache
def _kernel():
    """The Triton kernel, built at first use (Triton imported here, where it runs)."""
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["M"])
    def bi_linear(X, W, Y, M, stride_xm, N: tl.constexpr, K: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  PRECISION: tl.constexpr):
        """Y[rows, cols] = sum over K blocks in order of X[rows, k] W[cols, k]^T, fp32."""
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + ks
            x = tl.load(X + rows[:, None].to(tl.int64) * stride_xm + kk[None, :],
                        mask=(rows[:, None] < M) & (kk[None, :] < K), other=0.0)
            w = tl.load(W + cols[:, None].to(tl.int64) * K + kk[None, :],
                        mask=(cols[:, None] < N) & (kk[None, :] < K), other=0.0)
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
        tl.store(Y + rows[:, None].to(tl.int64) * N + cols[None, :],
                 acc.to(Y.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))

    @triton.jit(do_not_specialize=["M"])
    def bi_linear_splitk(X, W, P, M, stride_xm, N: tl.constexpr, K: tl.constexpr,
                         K_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
        """P[split, rows, cols] = sum over split's K blocks in order of X W^T, fp32."""
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        split = tl.program_id(2)
        ks = tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K_SPLIT, BLOCK_K):
            kk = split * K_SPLIT + k0 + ks
            x = tl.load(X + rows[:, None].to(tl.int64) * stride_xm + kk[None, :],
                        mask=(rows[:, None] < M) & (kk[None, :] < K), other=0.0)
            w = tl.load(W + cols[:, None].to(tl.int64) * K + kk[None, :],
                        mask=(cols[:, None] < N) & (kk[None, :] < K), other=0.0)
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
        out = P + split.to(tl.int64) * M * N + rows[:, None].to(tl.int64) * N + cols[None, :]
        tl.store(out, acc, mask=(rows[:, None] < M) & (cols[None, :] < N))

    @triton.jit(do_not_specialize=["MN"])
    def sum_splits(P, Y, MN, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
        """Y = the partials P[0] + P[1] + ... in that order, in Y's dtype."""
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        acc = tl.load(P + i, mask=i < MN, other=0.0)
        for s in range(1, SPLITS):
            acc += tl.load(P + s * MN + i, mask=i < MN, other=0.0)
        tl.store(Y + i, acc.to(Y.dtype.element_ty), mask=i < MN)

    return triton, bi_linear, bi_linear_splitk, sum_splits


def _precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision: 'ieee' for fp32 (the CPU's model dtype, in Triton's
    interpreter: no TF32 rounding), else Triton's default 'tf32' (unused by bf16 and fp16)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _operands(x: torch.Tensor, w: torch.Tensor):
    """The kernels' operands after _check: x with rows of unit stride along K, w contiguous,
    and the output y [M, N] in x's dtype, empty."""
    _check(x, w, KERNEL_DTYPES)
    if x.stride(1) != 1:
        x = x.contiguous()
    w = w.contiguous()
    return x, w, torch.empty(x.shape[0], w.shape[0], device=x.device, dtype=x.dtype)


def linear_kernel(x: torch.Tensor, w: torch.Tensor, tile: Tile = TILE) -> torch.Tensor:
    """x [M, K] (rows of unit stride along K) @ w [N, K]^T -> [M, N] in x's dtype through the
    Triton kernel (CUDA, or Triton's interpreter on the CPU: TRITON_INTERPRET=1), tile fixed.
    Raises ValueError for other ranks, K mismatch, dtypes other than bf16/fp16/fp32 or
    mixed."""
    x, w, y = _operands(x, w)
    if y.shape[0] == 0:
        return y
    (m, k), n = x.shape, w.shape[0]
    triton, kernel = _kernel()[:2]
    grid = (triton.cdiv(m, tile.block_m), triton.cdiv(n, tile.block_n))
    kernel[grid](x, w, y, m, x.stride(0), N=n, K=k, BLOCK_M=tile.block_m,
                 BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, PRECISION=_precision(x.dtype),
                 num_warps=tile.num_warps, num_stages=tile.num_stages)
    return y


def k_split(k: int, splits: int, tile: Tile = TILE) -> int:
    """The K each split of linear_splitk sums: K / splits rounded up to whole block_k
    blocks (the last split may hold fewer)."""
    return -(-(-(-k // splits)) // tile.block_k) * tile.block_k


def linear_splitk(x: torch.Tensor, w: torch.Tensor, splits: int,
                  tile: Tile = TILE) -> torch.Tensor:
    """linear_kernel with K cut into `splits` fixed parts (k_split), each part's blocks
    summed in order into an fp32 partial by its own programs, the partials then added in
    split order (a second kernel): more programs for few rows (a question's 64 rows: the
    down projection's 1,024 columns are 8 tiles of 128 alone), a row's bits still its own
    whatever M. Its bits are other than linear_kernel's for splits > 1. x [M, K], w [N, K]
    -> [M, N] in x's dtype; fp32 scratch of splits x M x N. Raises ValueError as
    linear_kernel, and for splits < 1."""
    if splits < 1:
        raise ValueError(f"linear_splitk takes splits >= 1, got {splits}")
    x, w, y = _operands(x, w)
    if y.shape[0] == 0:
        return y
    (m, k), n = x.shape, w.shape[0]
    triton, _, kernel, add = _kernel()
    part = torch.empty(splits, m, n, device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(m, tile.block_m), triton.cdiv(n, tile.block_n), splits)
    kernel[grid](x, w, part, m, x.stride(0), N=n, K=k, K_SPLIT=k_split(k, splits, tile),
                 BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
                 PRECISION=_precision(x.dtype), num_warps=tile.num_warps,
                 num_stages=tile.num_stages)
    block = 1024
    add[(triton.cdiv(m * n, block),)](part, y, m * n, SPLITS=splits, BLOCK=block)
    return y


def linear_splitk_twin(x: torch.Tensor, w: torch.Tensor, splits: int,
                       tile: Tile = TILE) -> torch.Tensor:
    """linear_splitk's slow pure-torch twin: linear_twin's sums per split (K cut as
    k_split cuts it), the fp32 partials added in split order. Row-invariant by construction,
    close to the kernel. Raises ValueError as linear_twin, and for splits < 1."""
    _check(x, w, KERNEL_DTYPES)
    if splits < 1:
        raise ValueError(f"linear_splitk takes splits >= 1, got {splits}")
    ks = k_split(x.shape[1], splits, tile)
    out = None
    for s in range(splits):
        lo, hi = s * ks, min((s + 1) * ks, x.shape[1])
        part = (linear_twin(x[:, lo:hi].float(), w[:, lo:hi].float(), tile) if lo < hi else
                torch.zeros(x.shape[0], w.shape[0], device=x.device))
        out = part if out is None else out + part
    return out.to(x.dtype)


def linear_twin(x: torch.Tensor, w: torch.Tensor, tile: Tile = TILE) -> torch.Tensor:
    """The kernel's slow pure-torch twin: x [M, K] @ w [N, K]^T -> [M, N] in x's dtype, K in
    tile.block_k blocks in order, each block's products (exact in fp32) added in k order to a
    zero fp32 partial, the partials added in order to an fp32 sum. Elementwise ops only, so a
    row's bits depend on nothing but its own inputs. Takes float32 too (the CPU's model
    dtype; its products are rounded then, still row by row). Raises ValueError as
    linear_kernel (dtypes: bf16, fp16, fp32)."""
    _check(x, w, KERNEL_DTYPES)
    xf, wf = x.float(), w.float()
    acc = torch.zeros(x.shape[0], w.shape[0], device=x.device, dtype=torch.float32)
    for k0 in range(0, x.shape[1], tile.block_k):
        part = torch.zeros_like(acc)
        for k in range(k0, min(k0 + tile.block_k, x.shape[1])):
            part = part + xf[:, k, None] * wf[None, :, k]
        acc = acc + part
    return acc.to(x.dtype)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The invariant linear where it runs fast: the kernel on CUDA, the twin elsewhere (the
    CPU: slow, for tests of the path). x [M, K], w [N, K] -> [M, N] in x's dtype."""
    if x.is_cuda:
        return linear_kernel(x, w)
    return linear_twin(x, w)
