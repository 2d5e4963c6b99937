"""Row-invariant versions of the row-wise ops of a layer, for the question runners on CUDA
(issue 36, item 3) and the grid chunk runner that batches (item 2): `norm_rope` (a q or k
head's norm, then RoPE), `gdn_gates` (the GDN q/k L2 norms, v, the decay g and beta),
`gated_rms_norm` (the GDN output's norm gated by z), each a Triton kernel with one program a
row and one fixed tile over all its heads ([heads, head_dim], warps fixed by the tile's size,
`_tile`), and `rms_norm` and `add_rms_norm` (the layers' norms, the residual add before), one
program a row and one block over it, so a row's bits depend on nothing but that row: not on
the row count, nor on the row's place in the tensor, nor on the other rows. (One program a
(row, head) was the first layout: at 512-4,096 rows of the 0.8B it ran 2-32 programs a row,
the GDN gates' and gated norm's of one value a thread.)

Why: torch.compile picks a row-wise op's kernel (its rows per program, warps, reduction
layout) by the row count, and over the rows of several questions at once its kernels gave
some questions' rows other bits than over each question's rows alone (evals/bi_bench.py
`row_ops`: `norm_rope` and `gdn_gates` on an H100, 2026-12-06,
docs/bi-bench-questions-h100-2026-12-06-c.log; `gated_rms_norm`: bi_bench `graphs`,
docs/bi-bench-graphs-q64-h100-2026-12-05.log); its `rms_norm` and `add_rms_norm` gave most
512-row blocks of a batch other bits (bi_bench `graphs`, docs/bi-bench-graphs-h100-2026-12-05.log),
and four grid chunks' q/k heads, GDN gates and gated norm over all rows gave other bits than
each chunk's alone (bi_bench `chunks`, docs/bi-bench-chunks-profile-h100-2026-12-06.log). With
these kernels a runner (a question runner below the grid, or the grid's chunk runner with
ops.rowwise_chunk_ops) and a batch of its forks (runners.batch, OneCall.rows and .norms) run
the same instructions on each row.

The formulas are ops.norm_rope's, ops.gdn_gates', ops.gated_rms_norm's, ops.rms_norm's and
ops.add_rms_norm's (docs/specs/qwen35.md sections 3.4, 4.3-4.8, 5): the norm in fp32, cast to
the input's dtype (for the layers' norms: the weight (1 + w) in fp32, one rounding at the end),
RoPE (or the weight and silu(z) gate) in fp32 from that, one rounding at the end; the L2 norms
in fp32; g = -exp(A_log) * softplus(a + dt_bias) in fp32 (softplus linear past 20, log1p
below, as torch's); beta = sigmoid(b) in b's dtype. Their eager versions in
adapters.model.ops are the slow twins: close (tests/kernels), not equal (the eager RoPE
rounds each product to bf16). Triton is imported when a kernel first runs (`_kernels`).
"""
from __future__ import annotations

import functools

import torch

# The reader's path names these kernels by this tag (runners.Runners.path, written into spilled
# files): a change of a kernel's reduction layout may change a row's bits, so it takes a new
# tag and sessions spilled under the old one are read again from 0. 2: a program a row over
# all its heads (b4be7dc; before, '+rowwise': a program per row and head).
PATH_TAG = "+rowwise2"


@functools.cache
def _kernels():
    """The Triton kernels, built at first use (Triton imported here, where they run)."""
    import triton
    import triton.language as tl

    @triton.jit
    def norm_rope_kernel(X, W, COS, SIN, Y, stride_xt, stride_xh, H, eps,
                         D: tl.constexpr, ROT: tl.constexpr, HP: tl.constexpr):
        """Program (row): Y[row, h] = rope(rms_norm(X[row, h]) * (1 + W)) for every head h
        (a [HP, D] tile, heads past H masked)."""
        row = tl.program_id(0)
        r64 = row.to(tl.int64)
        h = tl.arange(0, HP)[:, None]
        d = tl.arange(0, D)[None, :]
        ok = h < H
        base = X + r64 * stride_xt + h * stride_xh
        x = tl.load(base + d, mask=ok, other=0.0).to(tl.float32)
        w = tl.load(W + d).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)[:, None]
        n = (x * inv * (1.0 + w)).to(Y.dtype.element_ty).to(tl.float32)
        half: tl.constexpr = ROT // 2
        rot = d < ROT
        # rotate-half: dim i < ROT/2 takes -x[i + ROT/2], i in [ROT/2, ROT) takes x[i - ROT/2]
        partner = tl.where(d < half, d + half, d - half)
        xp = tl.load(base + partner, mask=rot & ok, other=0.0).to(tl.float32)
        wp = tl.load(W + partner, mask=rot, other=0.0).to(tl.float32)
        np_ = (xp * inv * (1.0 + wp)).to(Y.dtype.element_ty).to(tl.float32)
        c = tl.load(COS + r64 * ROT + d, mask=rot, other=1.0).to(tl.float32)
        s = tl.load(SIN + r64 * ROT + d, mask=rot, other=0.0).to(tl.float32)
        sign = tl.where(d < half, -1.0, 1.0)
        y = tl.where(rot, n * c + sign * np_ * s, n)
        tl.store(Y + (r64 * H + h) * D + d, y.to(Y.dtype.element_ty), mask=ok)

    @triton.jit
    def gates_kernel(M, B_, A_, ALOG, DTB, Q, K_, V, G, BETA, stride_mt, stride_bt, stride_at,
                     HK, HV, eps, KD: tl.constexpr, VD: tl.constexpr, HKP: tl.constexpr,
                     HVP: tl.constexpr):
        """Program (row): the row's q and k heads L2-normed ([HKP, KD] tiles), its v heads
        copied ([HVP, VD]), its g and beta ([HVP]); heads past HK, HV masked."""
        row = tl.program_id(0)
        r64 = row.to(tl.int64)
        m = M + r64 * stride_mt
        hk = tl.arange(0, HKP)[:, None]
        kk = tl.arange(0, KD)[None, :]
        okk = hk < HK
        q = tl.load(m + hk * KD + kk, mask=okk, other=0.0).to(tl.float32)
        k = tl.load(m + (HK + hk) * KD + kk, mask=okk, other=0.0).to(tl.float32)
        q = q / tl.sqrt(tl.sum(q * q, axis=1) + eps)[:, None]
        k = k / tl.sqrt(tl.sum(k * k, axis=1) + eps)[:, None]
        out = (r64 * HK + hk) * KD + kk
        tl.store(Q + out, q.to(Q.dtype.element_ty), mask=okk)
        tl.store(K_ + out, k.to(K_.dtype.element_ty), mask=okk)
        hv = tl.arange(0, HVP)[:, None]
        vv = tl.arange(0, VD)[None, :]
        okv = hv < HV
        v = tl.load(m + 2 * HK * KD + hv * VD + vv, mask=okv, other=0.0)
        tl.store(V + (r64 * HV + hv) * VD + vv, v, mask=okv)
        h = tl.arange(0, HVP)
        ok = h < HV
        a = tl.load(A_ + r64 * stride_at + h, mask=ok, other=0.0).to(tl.float32) + \
            tl.load(DTB + h, mask=ok, other=0.0).to(tl.float32)
        e = tl.exp(a)                      # softplus: log1p(e) by Goldberg's formula
        u = 1.0 + e
        den = tl.where(u == 1.0, 1.0, u - 1.0)
        soft = tl.where(a > 20.0, a, tl.where(u == 1.0, e, tl.log(u) * (e / den)))
        alog = tl.load(ALOG + h, mask=ok, other=0.0).to(tl.float32)
        tl.store(G + r64 * HV + h, -tl.exp(alog) * soft, mask=ok)
        b = tl.load(B_ + r64 * stride_bt + h, mask=ok, other=0.0).to(tl.float32)
        tl.store(BETA + r64 * HV + h, (1.0 / (1.0 + tl.exp(-b))).to(BETA.dtype.element_ty),
                 mask=ok)

    @triton.jit
    def gated_norm_kernel(X, Z, W, Y, stride_xt, stride_xh, stride_zt, stride_zh, H, eps,
                          D: tl.constexpr, HP: tl.constexpr):
        """Program (row): Y[row, h] = W * rms(X[row, h]) * silu(Z[row, h]) for every head h
        (a [HP, D] tile, heads past H masked)."""
        row = tl.program_id(0)
        r64 = row.to(tl.int64)
        h = tl.arange(0, HP)[:, None]
        d = tl.arange(0, D)[None, :]
        ok = h < H
        x = tl.load(X + r64 * stride_xt + h * stride_xh + d, mask=ok, other=0.0).to(tl.float32)
        z = tl.load(Z + r64 * stride_zt + h * stride_zh + d, mask=ok, other=0.0).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)[:, None]
        n = (x * inv).to(Y.dtype.element_ty).to(tl.float32)
        w = tl.load(W + d).to(tl.float32)
        y = w * n * (z / (1.0 + tl.exp(-z)))
        tl.store(Y + (r64 * H + h) * D + d, y.to(Y.dtype.element_ty), mask=ok)

    @triton.jit
    def rms_norm_kernel(X, H_, W, S, Y, stride_xt, stride_ht, N, eps, ADD: tl.constexpr,
                        BLOCK: tl.constexpr):
        """Program (row): with ADD, S[row] = X[row] + H_[row] (rounded to X's dtype) and Y[row]
        = rms_norm(S[row]) * (1 + W); else Y[row] = rms_norm(X[row]) * (1 + W). N <= BLOCK
        values a row, the sum of squares over one block of BLOCK (masked past N)."""
        row = tl.program_id(0)
        r64 = row.to(tl.int64)
        n = tl.arange(0, BLOCK)
        ok = n < N
        x = tl.load(X + r64 * stride_xt + n, mask=ok, other=0.0)
        if ADD:
            x = (x.to(tl.float32) + tl.load(H_ + r64 * stride_ht + n, mask=ok, other=0.0)
                 .to(tl.float32)).to(S.dtype.element_ty)
            tl.store(S + r64 * N + n, x, mask=ok)
        x = x.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
        w = tl.load(W + n, mask=ok, other=0.0).to(tl.float32)
        tl.store(Y + r64 * N + n, (x * inv * (1.0 + w)).to(Y.dtype.element_ty), mask=ok)

    return norm_rope_kernel, gates_kernel, gated_norm_kernel, rms_norm_kernel


def norm_rope(x: torch.Tensor, w: torch.Tensor, eps: float, cos: torch.Tensor,
              sin: torch.Tensor) -> torch.Tensor:
    """ops.norm_rope, row-invariant: x [T, H, D] (each head's D values contiguous; rows and
    heads may be strided, as a fused projection's slices), w [D], cos, sin [T, rotary_dim]
    (rotary_dim even, <= D) -> [T, H, D] contiguous in x's dtype. D must be a power of two.
    Raises ValueError for other shapes."""
    t, h, d = x.shape
    rot = cos.shape[-1]
    if x.stride(2) != 1 or d & (d - 1) or rot % 2 or rot > d or cos.shape != (t, rot) or \
            sin.shape != (t, rot) or w.shape != (d,) or w.stride(0) != 1:
        raise ValueError(f"norm_rope takes x [T, H, D] (D a power of two, unit stride), w [D] "
                         f"(unit stride), cos, sin [T, rotary_dim <= D, even]; got x "
                         f"{tuple(x.shape)} strides {x.stride()}, w {tuple(w.shape)} strides "
                         f"{w.stride()}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)}")
    y = torch.empty(t, h, d, device=x.device, dtype=x.dtype)
    if t:
        kernel = _kernels()[0]
        hp, warps = _tile(h, d)
        kernel[(t,)](x, w, cos.contiguous(), sin.contiguous(), y, x.stride(0), x.stride(1), h,
                     eps, D=d, ROT=rot, HP=hp, num_warps=warps)
    return y


def gdn_gates(mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, a_log: torch.Tensor,
              dt_bias: torch.Tensor, hk: int, kd: int, hv: int, vd: int):
    """ops.gdn_gates, row-invariant: mixed [T, 2 HK K + HV V] (unit stride along it; rows may
    be strided), b, a [T, HV] (the same) -> q, k [T, HK, K] (L2-normed), v [T, HV, V]
    (contiguous), g [T, HV] fp32, beta [T, HV] in b's dtype. K and V must be powers of two.
    Raises ValueError for other shapes."""
    t = mixed.shape[0]
    if mixed.shape[1] != 2 * hk * kd + hv * vd or mixed.stride(1) != 1 or kd & (kd - 1) or \
            vd & (vd - 1) or b.shape != (t, hv) or a.shape != (t, hv) or b.stride(1) != 1 or \
            a.stride(1) != 1 or a_log.shape != (hv,) or dt_bias.shape != (hv,) or \
            a_log.stride(0) != 1 or dt_bias.stride(0) != 1:
        raise ValueError(f"gdn_gates takes mixed [T, 2 HK K + HV V], b, a [T, HV] of unit "
                         f"column stride, A_log and dt_bias [HV] of unit stride, K and V powers "
                         f"of two; got mixed {tuple(mixed.shape)} strides {mixed.stride()}, b "
                         f"{tuple(b.shape)} strides {b.stride()}, a {tuple(a.shape)} strides "
                         f"{a.stride()}, A_log {tuple(a_log.shape)}, dt_bias "
                         f"{tuple(dt_bias.shape)} with HK {hk}, K {kd}, HV {hv}, V {vd}")
    dev, dt = mixed.device, mixed.dtype
    q = torch.empty(t, hk, kd, device=dev, dtype=dt)
    k = torch.empty(t, hk, kd, device=dev, dtype=dt)
    v = torch.empty(t, hv, vd, device=dev, dtype=dt)
    g = torch.empty(t, hv, device=dev, dtype=torch.float32)
    beta = torch.empty(t, hv, device=dev, dtype=b.dtype)
    if t:
        kernel = _kernels()[1]
        (hkp, warps_k), (hvp, warps_v) = _tile(hk, kd), _tile(hv, vd)
        kernel[(t,)](mixed, b, a, a_log, dt_bias, q, k, v, g, beta, mixed.stride(0),
                     b.stride(0), a.stride(0), hk, hv, 1e-6, KD=kd, VD=vd, HKP=hkp, HVP=hvp,
                     num_warps=max(warps_k, warps_v))
    return q, k, v, g, beta


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, w: torch.Tensor,
                   eps: float) -> torch.Tensor:
    """ops.gated_rms_norm, row-invariant: x, z [T, H, D] (each head's D values contiguous;
    rows and heads may be strided, as z's column slice of a fused projection), w [D] ->
    [T, H, D] contiguous in x's dtype: w * (x's RMSNorm, cast to x's dtype) * silu(z), in
    fp32, one rounding at the end. D must be a power of two. Raises ValueError for other
    shapes."""
    t, h, d = x.shape
    if z.shape != x.shape or x.stride(2) != 1 or z.stride(2) != 1 or d & (d - 1) or \
            w.shape != (d,) or w.stride(0) != 1:
        raise ValueError(f"gated_rms_norm takes x, z [T, H, D] (D a power of two, unit stride) "
                         f"and w [D] (unit stride); got x {tuple(x.shape)} strides {x.stride()}, "
                         f"z {tuple(z.shape)} strides {z.stride()}, w {tuple(w.shape)} strides "
                         f"{w.stride()}")
    y = torch.empty(t, h, d, device=x.device, dtype=x.dtype)
    if t:
        kernel = _kernels()[2]
        hp, warps = _tile(h, d)
        kernel[(t,)](x, z, w, y, x.stride(0), x.stride(1), z.stride(0), z.stride(1), h, eps,
                     D=d, HP=hp, num_warps=warps)
    return y


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """ops.rms_norm, row-invariant: x [T, N] (unit stride along a row; rows may be strided),
    w [N] -> [T, N] contiguous in x's dtype: x * rsqrt(mean(x^2) + eps) * (1 + w) in fp32,
    one rounding at the end, the sum of squares over one block of the next power of two
    >= N. Raises ValueError for other shapes."""
    _check_norm("rms_norm", x, None, w)
    y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    if x.shape[0]:
        _norm_rows(x, x, w, y, y, eps, add=False)
    return y


def add_rms_norm(x: torch.Tensor, h: torch.Tensor, w: torch.Tensor, eps: float):
    """ops.add_rms_norm, row-invariant: the residual add, then `rms_norm` of the sum: x, h
    [T, N] (unit stride along a row), w [N] -> (x + h, its norm), both [T, N] contiguous in
    x's dtype (the sum in fp32, rounded once to x's dtype before the norm). Raises ValueError
    for other shapes."""
    _check_norm("add_rms_norm", x, h, w)
    s = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    y = torch.empty_like(s)
    if x.shape[0]:
        _norm_rows(x, h, w, s, y, eps, add=True)
    return s, y


def _tile(num_heads: int, head_dim: int) -> tuple[int, int]:
    """(heads padded to a power of two, warps) of one program's [heads, head_dim] tile: the
    warps fixed by the tile's size (one per 512 values, 1 to 16: a thread holds at most 16
    values of a tile of up to 8,192, more past that), never by the row count, so every row
    runs the same instructions."""
    import triton
    hp = triton.next_power_of_2(num_heads)
    return hp, min(max(1, hp * head_dim // 512), 16)


def _check_norm(name: str, x: torch.Tensor, h: torch.Tensor | None, w: torch.Tensor) -> None:
    """ValueError unless x (and h: its shape and dtype) is [T, N] of unit stride along a row
    and w is [N] of unit stride."""
    ok = x.dim() == 2 and x.stride(1) == 1 and w.shape == (x.shape[-1],) and w.stride(0) == 1
    if h is not None:
        ok = ok and h.shape == x.shape and h.dtype == x.dtype and h.stride(1) == 1
    if not ok:
        got = f"x {tuple(x.shape)} strides {x.stride()}" + (
            "" if h is None else f", h {tuple(h.shape)} {h.dtype} strides {h.stride()}")
        raise ValueError(f"{name} takes x [T, N]{'' if h is None else ', h like x'} (unit "
                         f"stride along a row) and w [N] (unit stride); got {got}, x {x.dtype}, "
                         f"w {tuple(w.shape)} strides {w.stride()}")


def _norm_rows(x, h, w, s, y, eps: float, add: bool) -> None:
    """One program a row of rms_norm_kernel (module doc; `add`: the residual add first)."""
    import triton
    t, n = x.shape
    block = triton.next_power_of_2(n)
    # warps fixed by the row's length (4 up to 1,024 values: the 0.8B's hidden size, as
    # measured; more for longer rows, so a thread holds at most 16 fp32 values of a row)
    _kernels()[3][(t,)](x, h, w, s, y, x.stride(0), h.stride(0), n, eps, ADD=add,
                        BLOCK=block, num_warps=min(max(4, block // 512), 16))


def fits(cfg) -> bool:
    """Whether these kernels take the model's heads (a models.config.ModelConfig): head_dim
    and the GDN key and value head dims powers of two (a head is one row of a tile), the
    rotary dims even and within head_dim."""
    dims = (cfg.head_dim, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
    return all(d > 0 and not d & (d - 1) for d in dims) and cfg.rotary_dim % 2 == 0 and \
        cfg.rotary_dim <= cfg.head_dim
