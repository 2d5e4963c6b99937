"""The small ops of a layer (norms, gates, activations, RoPE, the GDN conv) as pure functions of
tensors, so the chunk runner can swap in fused versions (`fused_ops`: torch.compile, one Triton
kernel a function instead of 5-10 launches) while the eager forward keeps these reference
versions.

Formulas: docs/specs/qwen35.md sections 3.4 (partial RoPE, rotate-half), 4.3-4.8 (GDN gates, L2
norm, gated norm), 5 (zero-centred RMSNorm, SwiGLU). Fused versions compute in fp32 and may round
intermediate values differently, so their bits differ from these; the reader's chunks all go
through one runner, so its state still equals a fresh prefill through that runner.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from typing import Callable

import torch
import torch.nn.functional as F

from adapters.model.ref import l2norm


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm over the last dim: x * rsqrt(mean(x^2) + eps) * (1 + w) in fp32,
    cast to x's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + w.float())).to(x.dtype)


def add_rms_norm(x: torch.Tensor, h: torch.Tensor, w: torch.Tensor, eps: float):
    """Residual add then norm: (x + h, rms_norm(x + h)), both [T, hidden] in x's dtype."""
    x = x + h
    return x, rms_norm(x, w, eps)


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """The GDN output norm over one value head (plain weight) gated by silu(z): x, z [T, HV, V]."""
    xf = x.float()
    n = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (w * n * F.silu(z.float())).to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; rotate the first rotary_dim dims (rotate-half), pass the rest through."""
    rot = cos.shape[-1]
    xr, xp = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)
    xr = xr * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat([xr, xp], dim=-1)


def norm_rope(x: torch.Tensor, w: torch.Tensor, eps: float, cos: torch.Tensor,
              sin: torch.Tensor) -> torch.Tensor:
    """Per-head q or k norm, then RoPE: x [T, H, D] -> [T, H, D]."""
    return apply_rope(rms_norm(x, w, eps), cos, sin)


def gdn_gates(mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor, a_log: torch.Tensor,
              dt_bias: torch.Tensor, hk: int, kd: int, hv: int, vd: int):
    """From the conv output mixed [T, 2 * HK * K + HV * V] and the b, a projections [T, HV]:
    q, k [T, HK, K] (L2-normed), v [T, HV, V] (contiguous: fla's GDN kernels copy a strided v
    themselves, a slower copy kernel of their own; 18 a chunk on the H200 profile), g [T, HV]
    fp32 (log decay), beta [T, HV]."""
    t = mixed.shape[0]
    q, k, v = mixed.split([hk * kd, hk * kd, hv * vd], dim=-1)
    q = l2norm(q.reshape(t, hk, kd))
    k = l2norm(k.reshape(t, hk, kd))
    beta = torch.sigmoid(b)
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return q, k, v.reshape(t, hv, vd).contiguous(), g, beta


def conv_gates(qkv: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, b: torch.Tensor,
               a: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, hk: int, kd: int,
               hv: int, vd: int):
    """The GDN layer's short conv and gates as one function, for torch.compile to fuse (with
    `fused_ops(compile_conv=True)`, in place of the kernel set's conv + `gdn_gates`: fewer
    kernels, but 1-3 % slower a chunk on the H200, so not the default).

    qkv [T, D] raw in_proj_qkv outputs (any strides), weight [D, W] (tap W - 1 is the current
    token), state [D, W] the last W raw inputs (ref.CONV_LAYOUT). The conv sums the W taps in
    fp32 in tap order, SiLU, cast to qkv's dtype (ref.causal_conv1d's formula; its bits
    differ). Returns gdn_gates' (q, k, v, g, beta) with v contiguous (the GDN kernel takes it as
    it lies), and the new state [D, W] in qkv's dtype."""
    t, width = qkv.shape[0], weight.shape[1]
    full = torch.cat([state.t().to(qkv.dtype), qkv], dim=0)             # [W + T, D]
    acc = full[1:1 + t].float() * weight[:, 0].float()
    for w in range(1, width):
        acc = acc + full[1 + w:1 + w + t].float() * weight[:, w].float()
    mixed = F.silu(acc).to(qkv.dtype)
    q, k, v, g, beta = gdn_gates(mixed, b, a, a_log, dt_bias, hk, kd, hv, vd)
    return q, k, v, g, beta, full[-width:].t().contiguous()


def sigmoid_gate(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """Attention output gate: o [T, H * D] * sigmoid(gate) (gate [T, H * D] or [T, H, D], any
    strides: the fused version reads it as it lies)."""
    return o * torch.sigmoid(gate).reshape(o.shape)


def swiglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """silu(g) * u, [T, intermediate]."""
    return F.silu(g) * u


@dataclass(frozen=True)
class Ops:
    rms_norm: Callable = rms_norm
    add_rms_norm: Callable = add_rms_norm
    gated_rms_norm: Callable = gated_rms_norm
    norm_rope: Callable = norm_rope
    gdn_gates: Callable = gdn_gates
    sigmoid_gate: Callable = sigmoid_gate
    swiglu: Callable = swiglu
    conv_gates: Callable | None = None     # None: the kernel set's conv, then gdn_gates
    linear: Callable = F.linear            # the projections (never compiled; model.gemv)
    # the MLP's down projection where it is not `linear`: it must be row-invariant (a
    # batch of questions runs it over all its rows, row_invariant_ops); None: `linear`
    down: Callable | None = None

    def down_proj(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The MLP's down projection x [T, I] @ w [hidden, I]^T -> [T, hidden] through `down`,
        or `linear` where that is None."""
        return (self.down or self.linear)(x, w)


EAGER = Ops()


def fused_ops(compile_conv: bool = False) -> Ops:
    """Every op through torch.compile (static shapes; compiled at first call per shape, which
    the chunk runner does before capturing its graph). A reader has runners of several
    lengths (grid, question buckets, decode), each a shape per op: dynamo's default limit of 8
    compiles per function is raised to 64 (a torch-wide setting). compile_conv: the GDN conv
    compiled with its gates (`conv_gates`) instead of the kernel set's conv (fla's on CUDA);
    off by default: on the H200 it read 1-3 % slower a chunk at every context, both op sets in
    one process with chunks alternating (evals/ops_ab.py at cadb457,
    docs/ops-ab-2026-11-29.log), though it launches fewer kernels."""
    dynamo = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo, name):
            setattr(dynamo, name, max(getattr(dynamo, name), 64))
    fns = {f.name: getattr(EAGER, f.name) for f in fields(Ops)
           if f.name not in ("linear", "down")}
    fns["conv_gates"] = conv_gates if compile_conv else None
    return Ops(**{name: fn and torch.compile(fn, dynamic=False, fullgraph=True)
                  for name, fn in fns.items()})


def decode_ops(op_set: Ops) -> Ops:
    """op_set with single-row projections (the down projection's too) through model.gemv
    (CUDA; F.linear elsewhere): the ops of the fork decode runner, whose bits no committed
    state depends on."""
    from adapters.model.gemv import linear
    return replace(op_set, linear=linear, down=None)


def rowwise_chunk_ops(op_set: Ops) -> Ops:
    """op_set with every row-wise reduction through model.rowwise's Triton kernels (one
    program a row, over all its heads: a row's bits never depend on the row count): the
    layers' `rms_norm` and `add_rms_norm`, `norm_rope`, `gdn_gates` and `gated_rms_norm`;
    the projections (the down projection's too) stay op_set's. The grid chunk runner's ops on
    CUDA with row-invariant chunks (runners.Runners' row_invariant): a batch of grid chunks of
    several sessions (runners.batch, OneCall.rows and .norms) then runs these over all its
    rows and gives each chunk the bits it gets alone, where the compiled ops gave other bits
    (model.rowwise's module doc)."""
    from adapters.model import rowwise
    return replace(op_set, rms_norm=rowwise.rms_norm, add_rms_norm=rowwise.add_rms_norm,
                   norm_rope=rowwise.norm_rope, gdn_gates=rowwise.gdn_gates,
                   gated_rms_norm=rowwise.gated_rms_norm)


# the down projection's K parts in the question runners (model.invariant.linear_splitk):
# a 64-row question's 1,024 output columns are 8 tiles; 8 parts of its 3,584 K make 64
# programs alone (the 0.8B)
DOWN_SPLITS = 8


def row_invariant_ops(op_set: Ops) -> Ops:
    """op_set with `norm_rope`, `gdn_gates` and `gated_rms_norm` through model.rowwise's
    Triton kernels (a program a row over all its heads: a row's bits never depend on the row
    count; CUDA, or Triton's interpreter) and the down projection through model.invariant's split-K
    kernel (`down`: fixed tiles and K parts summed in order, DOWN_SPLITS): the ops of the
    question runners below the grid on CUDA, so that a batch of questions
    (runners.batch, OneCall.rows) gives each the bits it gets alone."""
    from adapters.model import invariant, rowwise
    return replace(op_set, norm_rope=rowwise.norm_rope, gdn_gates=rowwise.gdn_gates,
                   gated_rms_norm=rowwise.gated_rms_norm,
                   down=functools.partial(invariant.linear_splitk, splits=DOWN_SPLITS))
