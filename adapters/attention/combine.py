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


@triton.jit(do_not_specialize=["S1"])      # one compile for every S1 up to S_MAX
def _combine_lse_kernel(O_PART, LSE, OUT, T, T_SEQ, STRIDE_S, STRIDE_B, STRIDE_H, S1,
                        H: tl.constexpr, D: tl.constexpr, S_MAX: tl.constexpr):
    """Program per row t*H + h: its S1 partial outputs merged by their log-sum-exp, summed in
    split order. The loops are unrolled to S_MAX >= S1 (a power of two: one compile serves
    every S1 up to it), so every split's loads are in flight at once instead of one round
    trip after another; the splits from S1 on are masked: -inf to the max, weight 0, which
    adds +0 to the sums and leaves their bits as S1 splits give them. Row t's log-sum-exps:
    sequence t // T_SEQ, its row t % T_SEQ, at LSE + s STRIDE_S + (t // T_SEQ) STRIDE_B +
    h STRIDE_H + t % T_SEQ."""
    r = tl.program_id(0)
    t, h = r // H, r % H
    d = tl.arange(0, D)
    at = LSE + (t // T_SEQ) * STRIDE_B + h * STRIDE_H + t % T_SEQ
    m = tl.load(at)
    for s in tl.static_range(1, S_MAX):
        m = tl.maximum(m, tl.load(at + s * STRIDE_S, mask=s < S1, other=float("-inf")))
    den = tl.zeros([1], tl.float32)
    acc = tl.zeros([D], tl.float32)
    for s in tl.static_range(0, S_MAX):
        ok = s < S1
        w = tl.where(ok, tl.exp(tl.load(at + s * STRIDE_S, mask=ok, other=0.0) - m), 0.0)
        acc += w * tl.load(O_PART + ((s * T + t) * H + h) * D + d, mask=ok,
                           other=0.0).to(tl.float32)
        den += w
    tl.store(OUT + r * D + d, (acc / den).to(OUT.dtype.element_ty))


def combine_lse(o_part: torch.Tensor, lse_part: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Merge attention over S1 disjoint key ranges: o_part [S1, T, H, D] (contiguous; each
    range's normalised output, any float dtype), lse_part fp32 (natural log-sum-exp of each
    range's scaled scores; every row must have at least one finite value), either [S1, H, T]
    or, for B sequences of t rows each (T = B t, o_part's rows sequence-major), [S1, B, H, t];
    its last dimension contiguous, any other strides (a view, read in place) -> out
    [T, H * D] (contiguous), in fp32 then out's dtype, splits in order. One compile per
    power of two at or above S1 (its loops are unrolled to it: `warm_up`). Raises
    ValueError for other shapes or layouts (checked on the host, nothing read). Twin:
    combine_ref."""
    s1, t, h, d = o_part.shape
    shapes = {3: (s1, h, t), 4: (s1, -1, h, -1)}
    want = shapes.get(lse_part.dim())
    if not o_part.is_contiguous() or want is None or lse_part.stride(-1) != 1 or \
            lse_part.dtype != torch.float32 or any(
                w not in (-1, n) for w, n in zip(want, lse_part.shape)) or \
            (lse_part.dim() == 4 and lse_part.shape[1] * lse_part.shape[3] != t) or \
            out.shape != (t, h * d) or not out.is_contiguous():
        raise ValueError(f"combine_lse takes o_part [S1, T, H, D] contiguous, lse_part fp32 "
                         f"[S1, H, T] or [S1, B, H, t] (B t = T) with its last dimension "
                         f"contiguous, out [T, H * D] contiguous; got o_part "
                         f"{tuple(o_part.shape)} strides {o_part.stride()}, lse_part "
                         f"{tuple(lse_part.shape)} {lse_part.dtype} strides "
                         f"{lse_part.stride()}, out {tuple(out.shape)} strides {out.stride()}")
    if lse_part.dim() == 3:                   # [S1, H, T]: one sequence of T rows
        stride_s, stride_h = lse_part.stride(0), lse_part.stride(1)
        t_seq, stride_b = t, 0
    else:                                     # [S1, B, H, t]
        stride_s, stride_b, stride_h = lse_part.stride()[:3]
        t_seq = lse_part.shape[3]
    _combine_lse_kernel[(t * h,)](o_part, lse_part, out, t, t_seq, stride_s, stride_b,
                                  stride_h, s1, H=h, D=d, S_MAX=triton.next_power_of_2(s1))
    return out


def warm_up(splits, t: int, num_heads: int, head_dim: int, device: torch.device,
            dtype: torch.dtype) -> None:
    """combine_lse compiled for every split count S in `splits` (S + 1 parts; 0 has no
    combine: one compile per power of two at or above S + 1) over t rows of num_heads heads
    of head_dim, so that no chunk or CUDA graph capture compiles one later (a compile inside
    a capture would fail it)."""
    done = set()
    for s in splits:
        if s and triton.next_power_of_2(s + 1) not in done:
            done.add(triton.next_power_of_2(s + 1))
            o_part = torch.zeros(s + 1, t, num_heads, head_dim, device=device, dtype=dtype)
            lse = torch.zeros(s + 1, num_heads, t, device=device, dtype=torch.float32)
            combine_lse(o_part, lse, torch.empty(t, num_heads * head_dim, device=device,
                                                 dtype=dtype))


def combine_ref(o_part: torch.Tensor, lse_part: torch.Tensor) -> torch.Tensor:
    """Twin of combine_lse in fp32: o_part [S1, T, H, D] (each split's normalised output),
    lse_part [S1, H, T] or [S1, B, H, t] fp32 (natural log-sum-exp of its scaled scores)
    -> [T, H * D] in o_part's dtype: sum_s exp(lse_s - m) o_s / sum_s exp(lse_s - m), m the
    max over s."""
    s1, t, h, d = o_part.shape
    if lse_part.dim() == 4:                   # [S1, B, H, t] -> [S1, H, B t]
        lse_part = lse_part.permute(0, 2, 1, 3).reshape(s1, h, t)
    w = torch.softmax(lse_part.float(), dim=0).permute(0, 2, 1)[..., None]   # [S1, T, H, 1]
    return (w * o_part.float()).sum(0).reshape(t, h * d).to(o_part.dtype)
