"""model.invariant: the batch-invariant linear (Triton, run by Triton's interpreter on the CPU
and natively on a GPU) and its pure-torch twin. Each output row has the same bits for every
row count M, every offset of the row and every batch around it; both are close to an fp64 GEMM.

Skipped where triton is not installed. The interpreter's tl.dot multiplies bfloat16 operands as
their raw 16-bit patterns (numpy has no bfloat16), so the kernel's tests run in float16 there
(bfloat16 too on a GPU); shapes are small, with a small tile, for the interpreter's speed."""
from __future__ import annotations

import functools
import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

from adapters.model import invariant  # noqa: E402

SMALL = invariant.Tile(16, 16, 16, 4, 2)
ROW_COUNTS = (1, 3, 17, 64, 511, 512, 2048)
N, K = 24, 40                 # neither a multiple of the tile: masked edges in N and K
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED or not torch.cuda.is_available() else "cuda"
DTYPES = [torch.float16] if DEVICE == "cpu" else [torch.float16, torch.bfloat16]
pytestmark = pytest.mark.skipif(not INTERPRETED and not torch.cuda.is_available(),
                                reason="Triton's interpreter on the CPU, or a GPU")


def _data(m, dtype, seed=0, n=N, k=K):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DEVICE, dtype)
    return x, w


def _close(got, x, w):
    """Largest error against an fp64 GEMM, relative to max(1, |y|)."""
    want = x.double() @ w.double().t()
    return ((got.double() - want).abs() / want.abs().clamp_min(1)).max().item()


def _row_invariant(fn, dtype):
    """fn over the first m rows of one input, for every m in ROW_COUNTS: each row's bits equal
    the rows of the largest GEMM; and a row at other offsets and among other rows."""
    x, w = _data(max(ROW_COUNTS), dtype)
    big = fn(x, w)
    for m in ROW_COUNTS:
        assert torch.equal(fn(x[:m], w), big[:m]), f"rows differ at M={m}"
    for start in (1, 5, 63, 300):                           # the same rows at another offset
        assert torch.equal(fn(x[start:start + 17], w), big[start:start + 17]), start
    other, _ = _data(900, dtype, seed=1)
    for before, after in ((0, 5), (3, 0), (64, 512), (511, 1)):   # batches around 17 rows
        mixed = torch.cat([other[:before], x[:17], other[before:before + after]])
        assert torch.equal(fn(mixed, w)[before:before + 17], big[:17]), (before, after)
    return big, x, w


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_kernel_gives_a_row_the_same_bits_in_every_gemm(dtype):
    fn = functools.partial(invariant.linear_kernel, tile=SMALL)
    big, x, w = _row_invariant(fn, dtype)
    assert big.dtype == dtype and big.shape == (max(ROW_COUNTS), N)
    # fp32 sums, one rounding to 16 bits: a few units of rounding (fp16's unit 2^-11, bf16's
    # 2^-8 = 3.9e-3, which bf16 reached on an H100, 2026-12-06)
    assert _close(big, x, w) < (2e-3 if dtype == torch.float16 else 8e-3)
    assert torch.equal(fn(x, w), big)                   # one fixed order: the same bits again


def test_the_twin_gives_a_row_the_same_bits_in_every_gemm_and_is_close_to_the_kernel():
    twin = functools.partial(invariant.linear_twin, tile=SMALL)
    big, x, w = _row_invariant(twin, torch.float16)
    assert _close(big, x, w) < 2e-3
    kernel = invariant.linear_kernel(x, w, SMALL)
    assert (kernel.float() - big.float()).abs().max().item() < 4e-3   # a 16-bit ulp or two


def test_the_default_tile_and_strided_rows():
    """The default tile (what the model runs) over shapes not a multiple of it, x a column
    slice of a wider tensor (rows strided), against the contiguous copy's bits."""
    x, w = _data(70, torch.float16, seed=3, n=130, k=72)
    wide = torch.cat([x, x[:, :8]], dim=1)[:, :72]
    got = invariant.linear_kernel(wide, w)
    assert torch.equal(got, invariant.linear_kernel(x.contiguous(), w))
    assert torch.equal(got[5:9], invariant.linear_kernel(x[5:9], w))
    assert _close(got, x, w) < 2e-3


def test_bad_inputs_are_refused():
    x, w = _data(4, torch.float16)
    with pytest.raises(ValueError, match=r"x \[M, K\] and w \[N, K\]"):
        invariant.linear_kernel(x, w[:, :8])
    with pytest.raises(ValueError, match="one dtype"):
        invariant.linear_kernel(x.float(), w)
    with pytest.raises(ValueError, match="one dtype"):
        invariant.linear_kernel(x.double(), w.double())
    with pytest.raises(ValueError, match="one dtype"):
        invariant.linear_twin(x, w.float())
    with pytest.raises(ValueError, match="power of two"):
        invariant.Tile(48, 16, 16)
    assert invariant.Tile.parse("32x64x32") == invariant.Tile(32, 64, 32)
    with pytest.raises(ValueError, match="BMxBNxBK"):
        invariant.Tile.parse("32x")


@pytest.mark.parametrize("splits", [1, 3])
def test_split_k_gives_a_row_the_same_bits_in_every_gemm(splits):
    """linear_splitk: K in `splits` fixed parts (40 = 16 + 16 + 8 at block_k 16 and 3 parts;
    one part: linear_kernel's sums), each row's bits the same for every row count; close to
    an fp64 GEMM and to its twin, which is row-invariant too."""
    fn = functools.partial(invariant.linear_splitk, splits=splits, tile=SMALL)
    big, x, w = _row_invariant(fn, torch.float16)
    assert _close(big, x, w) < 2e-3
    if splits == 1:
        assert torch.equal(big, invariant.linear_kernel(x, w, SMALL))
    twin = functools.partial(invariant.linear_splitk_twin, splits=splits, tile=SMALL)
    twin_big, _, _ = _row_invariant(twin, torch.float16)
    assert (twin_big.float() - big.float()).abs().max().item() < 4e-3
    assert invariant.k_split(K, 3, SMALL) == 16 and invariant.k_split(K, 1, SMALL) == 48
    with pytest.raises(ValueError, match="splits >= 1"):
        invariant.linear_splitk(x, w, 0, SMALL)


def test_split_k_takes_fp32_with_full_precision_dots():
    """fp32 (the tiny CPU model's dtype, ops.row_invariant_ops' down projection in Triton's
    interpreter): row-invariant, and near an fp64 GEMM (no TF32 rounding of the operands)."""
    fn = functools.partial(invariant.linear_splitk, splits=3, tile=SMALL)
    big, x, w = _row_invariant(fn, torch.float32)
    assert big.dtype == torch.float32
    assert _close(big, x, w) < 1e-5
