"""Attention of a chunk over a session's KV buffer, addressed through a device table, so one
CUDA graph serves every session and every context length (Triton; CUDA, or the CPU under
TRITON_INTERPRET=1 for tests). The pure-torch twin is `ref.attend_ref`.

Why our own kernel: SDPA's flash kernel takes the KV length and the buffer's address from the
host and reads no page table, so a captured graph would be valid for one session at one length;
here all come from device memory (`places`: per layer the k and v page pools' element offsets
from `base`, a tensor of the pools' dtype that the caller keeps, as int64; `pos`: [1] int64;
`pages`: the sequence's page table, int64), read by the kernel at replay. Key blocks lie within
one page (BLOCK_N divides the page's rows), so a page's place costs one load a block and
changes no bits. This is the only kernel of ours; GEMMs, GDN and conv stay cuBLAS and fla.

Why offsets from a base and not addresses: a pointer made from a loaded int64 carries no
alignment for Triton's analysis (a `multiple_of` on the integer did not reach the loads), so
the K and V loads were not vectorised. A probe copy of the decode kernel took 0.089 ms a layer
at 100k that way and 0.061 with the base and offsets (same bits; H200,
evals/decode_variants.py at cadb457, docs/decode-ptr-2026-12-02.log).

Numerics (fixed, so bits depend only on pos, T and the values, never on a buffer's capacity or
on which session ran before): scores q.k in fp32 from bf16 operands, scaled by D^-0.5 and taken
base 2; online softmax in fp32; P cast to the value dtype for the P.V product (as FlashAttention
does); the keys [0, pos + T) are cut into at most S_MAX splits of equal length (a multiple of
BLOCK_N, at least MIN_SPLIT keys), each split reduced by one program, the splits combined in
order by a second kernel (flash-decoding, Dao et al. 2023). Rows are (position, query head of one
KV group) pairs, so the G = H / Hkv query heads that share a KV head load it once.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from adapters.attention.combine import _attn_combine_kernel, _attn_combine_vec_kernel, _split_len
from adapters.attention.tiling import DECODE, READ, SplitConfig  # noqa: F401  (named here by callers)


@triton.jit
def _pool_row(PT, r, PAGE: tl.constexpr):
    """The pool row (in the [num_pages * PAGE] view) of sequence row r: page PT[r // PAGE]."""
    return tl.load(PT + r // PAGE) * PAGE + r % PAGE


@triton.jit
def _pools(BASE, PLACES, ALIGN: tl.constexpr):
    """The k and v pools: BASE plus the element offsets PLACES[0], PLACES[1] (multiples of
    ALIGN elements, 16 bytes: the loads can be vectorised)."""
    return (BASE + tl.multiple_of(tl.load(PLACES), ALIGN),
            BASE + tl.multiple_of(tl.load(PLACES + 1), ALIGN))


@triton.jit
def _kv_write_kernel(K, V, BASE, PLACES, POS, PT, SK, SV, ROW: tl.constexpr,
                     BLOCK: tl.constexpr, PAGE: tl.constexpr, ALIGN: tl.constexpr):
    """One program per new position t: K[t], V[t] ([ROW] = Hkv * D values, rows SK and SV
    elements apart) to sequence row pos + t, in the page the table PT names."""
    t = tl.program_id(0)
    pos = tl.load(POS)
    kp, vp = _pools(BASE, PLACES, ALIGN)
    o = tl.arange(0, BLOCK)
    m = o < ROW
    dst = _pool_row(PT, pos + t, PAGE).to(tl.int64) * ROW + o
    tl.store(kp + dst, tl.load(K + t * SK + o, mask=m), mask=m)
    tl.store(vp + dst, tl.load(V + t * SV + o, mask=m), mask=m)


@triton.jit
def _block(q, kp, vp, PT, start, hi, pos, t, kvh, m_i, l_i, acc, scale_log2, HKV: tl.constexpr,
           D: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr, MASKED: tl.constexpr):
    """One step of the online softmax over keys [start, start + BLOCK_N) (within one page:
    BLOCK_N divides PAGE and start is a multiple of BLOCK_N): returns the new (row max m_i
    [M], row sum l_i [M], acc [M, D]), all fp32; MASKED: keys >= hi or after a row's position
    are left out (else all are visible)."""
    base = _pool_row(PT, start, PAGE).to(tl.int64) - start      # pool row of key n: base + n
    return _block_at(q, kp, vp, base, start, hi, pos, t, kvh, m_i, l_i, acc, scale_log2, HKV,
                     D, BLOCK_N, MASKED)


@triton.jit
def _block_at(q, kp, vp, base, start, hi, pos, t, kvh, m_i, l_i, acc, scale_log2,
              HKV: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """_block with the block's page placed: key n lies in pool row base + n (int64)."""
    n = start + tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    off = (base + n)[:, None] * (HKV * D) + kvh * D + d[None, :]
    if MASKED:
        k = tl.load(kp + off, mask=(n < hi)[:, None], other=0.0)
    else:
        k = tl.load(kp + off)
    sc = tl.dot(q, tl.trans(k)) * scale_log2
    if MASKED:
        vis = (n[None, :] <= pos + t[:, None]) & (n[None, :] < hi)
        sc = tl.where(vis, sc, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(sc, 1))
    m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
    p = tl.exp2(sc - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    if MASKED:
        v = tl.load(vp + off, mask=(n < hi)[:, None], other=0.0)
    else:
        v = tl.load(vp + off)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    l_i = l_i * alpha + tl.sum(p, 1)
    return m_new, l_i, acc


@triton.jit
def _attn_split_kernel(Q, BASE, PLACES, POS, PT, O_PART, L_PART, T, scale_log2,
                       H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       S_MAX: tl.constexpr, MIN_SPLIT: tl.constexpr, PAGE: tl.constexpr,
                       PAGE_SPLITS: tl.constexpr, ALIGN_E: tl.constexpr, AHEAD: tl.constexpr):
    """Program (m, kv head, split): rows m*BLOCK_M.. of (t, g), keys of one split.
    Writes O_PART[s, t*H + h, :] (normalised, fp32) and L_PART[s, t*H + h] (log2-sum-exp).
    PAGE_SPLITS: splits of whole pages, walked a page at a time (one table load a page); the
    same blocks in the same order as the other walk, so the same bits for the same splits."""
    G: tl.constexpr = H // HKV
    ALIGN: tl.constexpr = PAGE if PAGE_SPLITS else BLOCK_N
    pid_m, kvh, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    pos = tl.load(POS)
    split = _split_len(pos + T, S_MAX, MIN_SPLIT, ALIGN)
    last_t = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // G, T - 1)
    lo = s * split
    hi = tl.minimum(lo + split, pos + last_t + 1)     # keys past hi are masked for every row
    if lo < hi:
        kp, vp = _pools(BASE, PLACES, ALIGN_E)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        t = rows // G
        head = kvh * G + rows % G
        row_ok = t < T
        d = tl.arange(0, D)
        q = tl.load(Q + (t * H + head)[:, None] * D + d[None, :], mask=row_ok[:, None],
                    other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        # Keys below pos + t0 + 1 (t0: the program's first position) are visible to every row:
        # whole blocks of them need no mask; the rest (the diagonal, the split's end) do. The
        # masks select what the unmasked path reads anyway, so both give the same bits.
        full = tl.minimum(hi, pos + (pid_m * BLOCK_M) // G + 1)
        full_end = lo + tl.maximum(full - lo, 0) // BLOCK_N * BLOCK_N
        if PAGE_SPLITS:
            for p0 in range(lo, hi, PAGE):
                base = tl.load(PT + p0 // PAGE).to(tl.int64) * PAGE - p0
                p_full = tl.minimum(tl.maximum(full_end, p0), p0 + PAGE)
                for start in range(p0, p_full, BLOCK_N):
                    m_i, l_i, acc = _block_at(q, kp, vp, base, start, hi, pos, t, kvh, m_i,
                                              l_i, acc, scale_log2, HKV, D, BLOCK_N, False)
                for start in range(p_full, tl.minimum(p0 + PAGE, hi), BLOCK_N):
                    m_i, l_i, acc = _block_at(q, kp, vp, base, start, hi, pos, t, kvh, m_i,
                                              l_i, acc, scale_log2, HKV, D, BLOCK_N, True)
        elif AHEAD:          # the next block's page entry loaded while this block is read
            pg = tl.load(PT + lo // PAGE).to(tl.int64)
            for start in range(lo, full_end, BLOCK_N):
                nxt = tl.load(PT + (start + BLOCK_N) // PAGE, mask=start + BLOCK_N < hi,
                              other=0).to(tl.int64)
                m_i, l_i, acc = _block_at(q, kp, vp, pg * PAGE - start // PAGE * PAGE, start,
                                          hi, pos, t, kvh, m_i, l_i, acc, scale_log2, HKV, D,
                                          BLOCK_N, False)
                pg = nxt
        else:
            for start in range(lo, full_end, BLOCK_N):
                m_i, l_i, acc = _block(q, kp, vp, PT, start, hi, pos, t, kvh, m_i, l_i, acc,
                                       scale_log2, HKV, D, BLOCK_N, PAGE, False)
        if not PAGE_SPLITS:
            for start in range(full_end, hi, BLOCK_N):
                m_i, l_i, acc = _block(q, kp, vp, PT, start, hi, pos, t, kvh, m_i, l_i, acc,
                                       scale_log2, HKV, D, BLOCK_N, PAGE, True)
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        out_row = s * T * H + t * H + head
        tl.store(O_PART + out_row[:, None] * D + d[None, :], acc / l_safe[:, None],
                 mask=row_ok[:, None])
        tl.store(L_PART + out_row, m_i + tl.log2(l_safe), mask=row_ok)


def pool_places(base: torch.Tensor, pools) -> list[int]:
    """What `places` holds: each pool's element offset from `base` (pools: tensors of base's
    dtype, e.g. a layer's k and v pools). Raises ValueError for another dtype or a pool whose
    distance from base is not a multiple of 16 bytes (the kernels' loads assume it)."""
    size, out = base.element_size(), []
    for x in pools:
        gap = x.data_ptr() - base.data_ptr()
        if x.dtype != base.dtype or gap % 16:
            raise ValueError(f"a pool of {x.dtype} at {x.data_ptr():#x}: the base is "
                             f"{base.dtype} at {base.data_ptr():#x}; the same dtype and a "
                             f"distance that is a multiple of 16 bytes are needed")
        out.append(gap // size)
    return out


def _align(base: torch.Tensor, x: torch.Tensor) -> int:
    """Elements in 16 bytes of base's dtype (offsets are multiples of it); ValueError when x,
    whose rows go to or come from the pools, is of another dtype."""
    if x.dtype != base.dtype:
        raise ValueError(f"rows of {x.dtype} with pools of {base.dtype}")
    return 16 // base.element_size()


def kv_rows(x: torch.Tensor) -> torch.Tensor:
    """x [T, Hkv, D] as write_kv takes it: itself when each row is contiguous within (the
    k, v column slices of a fused projection's rows), else a contiguous copy."""
    return x if x.stride(2) == 1 and x.stride(1) == x.shape[2] else x.contiguous()


def write_kv(k: torch.Tensor, v: torch.Tensor, base: torch.Tensor, places: torch.Tensor,
             pos: torch.Tensor, pages: torch.Tensor, page_rows: int) -> None:
    """k, v [T, Hkv, D] (each row's Hkv * D values contiguous; rows may be strided, as the
    slices of a fused projection are) -> sequence rows [pos, pos + T) of the k and v pools
    at element offsets places [2] int64 from base (`pool_places`; pools: contiguous
    [num_pages, page_rows, Hkv, D] of k's dtype), row r in page pages[r // page_rows] (pages:
    int64 page table); pos [1] int64. Nothing checks the table: the caller ensures it covers
    pos + T. Raises ValueError for rows that are not contiguous within or of another dtype
    than base."""
    t, hkv, d = k.shape
    for x in (k, v):
        if x.shape != (t, hkv, d) or x.stride(2) != 1 or x.stride(1) != d:
            raise ValueError(f"write_kv needs [T, Hkv, D] rows contiguous within, got shape "
                             f"{tuple(x.shape)} strides {x.stride()}")
    row = hkv * d
    _kv_write_kernel[(t,)](k, v, base, places, pos, pages, k.stride(0), v.stride(0), ROW=row,
                           BLOCK=triton.next_power_of_2(row), PAGE=page_rows,
                           ALIGN=max(_align(base, k), _align(base, v)))


def attend_table(q: torch.Tensor, base: torch.Tensor, places: torch.Tensor, pos: torch.Tensor,
                 num_kv_heads: int, o_part: torch.Tensor, l_part: torch.Tensor,
                 out: torch.Tensor, cfg: SplitConfig, pages: torch.Tensor,
                 page_rows: int) -> torch.Tensor:
    """Causal attention (bottom-right aligned) of q [T, H, D] at positions [pos, pos + T) over
    sequence rows [0, pos + T) of the k and v pools at element offsets places [2] int64 from
    base (`pool_places`; [num_pages, page_rows, Hkv, D] of q's dtype), row r in page
    pages[r // page_rows] (int64), written to out [T, H * D] (q's dtype).
    Scratch: o_part [cfg.s_max, T * H, D] fp32, l_part [cfg.s_max, T * H] fp32. D must be a
    power of two, H a multiple of num_kv_heads and page_rows a multiple of cfg.block_n (a
    block of keys lies in one page); with cfg.page_splits, cfg.min_split a multiple of
    page_rows. Raises ValueError for a page size the tiling does not divide or q of another
    dtype than base."""
    if page_rows % cfg.block_n:
        raise ValueError(f"pages of {page_rows} rows need a key block dividing them, got "
                         f"block_n {cfg.block_n}")
    if cfg.page_splits and cfg.min_split % page_rows:
        raise ValueError(f"page splits of pages of {page_rows} rows need min_split a multiple "
                         f"of them, got {cfg.min_split}")
    t, h, d = q.shape
    grid = (triton.cdiv(t * (h // num_kv_heads), cfg.block_m), num_kv_heads, cfg.s_max)
    scale_log2 = d ** -0.5 * 1.4426950408889634        # log2(e): softmax taken base 2
    _attn_split_kernel[grid](q, base, places, pos, pages, o_part, l_part, t, scale_log2, H=h,
                             HKV=num_kv_heads, D=d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                             S_MAX=cfg.s_max, MIN_SPLIT=cfg.min_split, PAGE=page_rows,
                             PAGE_SPLITS=cfg.page_splits, ALIGN_E=_align(base, q),
                             AHEAD=cfg.ahead,
                             num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    align = page_rows if cfg.page_splits else cfg.block_n
    if cfg.vector_combine:
        block_d = min(64, d)
        _attn_combine_vec_kernel[(t * h, d // block_d)](
            o_part, l_part, out, pos, t, H=h, D=d, ALIGN=align, S_MAX=cfg.s_max,
            MIN_SPLIT=cfg.min_split, BLOCK_D=block_d)
    else:
        _attn_combine_kernel[(t * h,)](o_part, l_part, out, pos, t, H=h, D=d, ALIGN=align,
                                       S_MAX=cfg.s_max, MIN_SPLIT=cfg.min_split)
    return out


def scratch(t: int, h: int, d: int, cfg: SplitConfig, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(o_part [s_max, T * H, D] fp32, l_part [s_max, T * H] fp32) for attend_table."""
    return (torch.empty(cfg.s_max, t * h, d, device=device, dtype=torch.float32),
            torch.empty(cfg.s_max, t * h, device=device, dtype=torch.float32))
