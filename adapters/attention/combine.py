"""The combines of split attention (flash-decoding, Dao et al. 2023): partial outputs over
disjoint key ranges merged by their log-sum-exps, for attention.table's table attention (its
splits of the keys, in split order or, for decode, all at once) and attention.fa4's splits
(`combine_lse`). Twin: combine_ref. Triton; the CPU under TRITON_INTERPRET=1 for
tests.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _split_len(end, S_MAX: tl.constexpr, MIN_SPLIT: tl.constexpr, ALIGN: tl.constexpr):
    """Keys per split for keys [0, end): end / S_MAX rounded up to ALIGN (BLOCK_N, or the page's
    rows for page splits), at least MIN_SPLIT (the split and combine kernels must agree)."""
    return tl.maximum(((end + S_MAX - 1) // S_MAX + ALIGN - 1) // ALIGN * ALIGN, MIN_SPLIT)


@triton.jit
def _attn_combine_kernel(O_PART, L_PART, OUT, POS, T, H: tl.constexpr, D: tl.constexpr,
                         ALIGN: tl.constexpr, S_MAX: tl.constexpr, MIN_SPLIT: tl.constexpr):
    """Program per row t*H + h: the splits that hold keys <= pos + t, combined in split order."""
    r = tl.program_id(0)
    pos = tl.load(POS)
    split = _split_len(pos + T, S_MAX, MIN_SPLIT, ALIGN)
    num_splits = (pos + r // H) // split + 1
    lse0 = tl.load(L_PART + r)                        # split 0 holds key 0: always present
    m = lse0
    for s in range(1, num_splits):
        m = tl.maximum(m, tl.load(L_PART + s * T * H + r))
    d = tl.arange(0, D)
    den = tl.exp2(lse0 - m)
    acc = den * tl.load(O_PART + r * D + d)
    for s in range(1, num_splits):
        w = tl.exp2(tl.load(L_PART + s * T * H + r) - m)
        acc += w * tl.load(O_PART + (s * T * H + r) * D + d)
        den += w
    tl.store(OUT + r * D + d, (acc / den).to(OUT.dtype.element_ty))


@triton.jit
def _attn_combine_vec_kernel(O_PART, L_PART, OUT, POS, T, H: tl.constexpr, D: tl.constexpr,
                             ALIGN: tl.constexpr, S_MAX: tl.constexpr, MIN_SPLIT: tl.constexpr,
                             BLOCK_D: tl.constexpr):
    """Program (row t*H + h, columns c*BLOCK_D..): `_attn_combine_kernel` with every split
    loaded at once ([S_MAX] log-sum-exps, [S_MAX, BLOCK_D] outputs) and summed as a vector."""
    r, c = tl.program_id(0), tl.program_id(1)
    pos = tl.load(POS)
    split = _split_len(pos + T, S_MAX, MIN_SPLIT, ALIGN)
    s = tl.arange(0, S_MAX)
    ok = s < (pos + r // H) // split + 1
    lse = tl.load(L_PART + s * T * H + r, mask=ok, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, 0))                 # split 0 is always there: a finite max
    d = c * BLOCK_D + tl.arange(0, BLOCK_D)
    o = tl.load(O_PART + (s * T * H + r)[:, None] * D + d[None, :], mask=ok[:, None], other=0.0)
    acc = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tl.store(OUT + r * D + d, acc.to(OUT.dtype.element_ty))


@triton.jit
def _combine_lse_kernel(O_PART, LSE, OUT, T, H: tl.constexpr, D: tl.constexpr, S1):
    """Program per row t*H + h: its S1 partial outputs merged by their log-sum-exp."""
    r = tl.program_id(0)
    t, h = r // H, r % H
    d = tl.arange(0, D)
    m = tl.load(LSE + h * T + t)
    for s in range(1, S1):
        m = tl.maximum(m, tl.load(LSE + (s * H + h) * T + t))
    den = tl.zeros([1], tl.float32)
    acc = tl.zeros([D], tl.float32)
    for s in range(0, S1):
        w = tl.exp(tl.load(LSE + (s * H + h) * T + t) - m)
        acc += w * tl.load(O_PART + ((s * T + t) * H + h) * D + d).to(tl.float32)
        den += w
    tl.store(OUT + r * D + d, (acc / den).to(OUT.dtype.element_ty))


def combine_lse(o_part: torch.Tensor, lse_part: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Merge attention over S1 disjoint key ranges: o_part [S1, T, H, D] (each range's
    normalised output, any float dtype), lse_part [S1, H, T] fp32 (natural log-sum-exp of its
    scaled scores; every row must have at least one finite value) -> out [T, H * D]
    (contiguous), in fp32 then out's dtype, splits in order. Raises ValueError for other
    shapes or layouts (checked on the host, nothing read). Twin: combine_ref."""
    s1, t, h, d = o_part.shape
    if not o_part.is_contiguous() or lse_part.shape != (s1, h, t) or \
            not lse_part.is_contiguous() or lse_part.dtype != torch.float32 or \
            out.shape != (t, h * d) or not out.is_contiguous():
        raise ValueError(f"combine_lse takes o_part [S1, T, H, D], lse_part fp32 [S1, H, T] "
                         f"and out [T, H * D], all contiguous; got o_part "
                         f"{tuple(o_part.shape)} strides {o_part.stride()}, lse_part "
                         f"{tuple(lse_part.shape)} {lse_part.dtype} strides "
                         f"{lse_part.stride()}, out {tuple(out.shape)} strides {out.stride()}")
    _combine_lse_kernel[(t * h,)](o_part, lse_part, out, t, H=h, D=d, S1=s1)
    return out


def combine_ref(o_part: torch.Tensor, lse_part: torch.Tensor) -> torch.Tensor:
    """Twin of combine_lse in fp32: o_part [S1, T, H, D] (each split's normalised
    output),
    lse_part [S1, H, T] fp32 (natural log-sum-exp of its scaled scores) -> [T, H * D] in
    o_part's dtype: sum_s exp(lse_s - m) o_s / sum_s exp(lse_s - m), m the max over s."""
    s1, t, h, d = o_part.shape
    w = torch.softmax(lse_part.float(), dim=0).permute(0, 2, 1)[..., None]   # [S1, T, H, 1]
    return (w * o_part.float()).sum(0).reshape(t, h * d).to(o_part.dtype)
