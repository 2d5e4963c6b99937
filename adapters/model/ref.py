"""Pure-torch reference kernels: the CPU path and the oracle for the CUDA path.

One sequence per call (no batch axis). Layouts:
- q, k: [T, Hk, K]; v: [T, HV, V]; g (log decay, fp32) and beta: [T, HV];
- recurrent state: [HV, K, V] fp32, key dimension first (RECURRENT_LAYOUT);
- conv input x: [T, D]; conv weight: [D, W]; conv state: [D, W], the last W raw inputs (CONV_LAYOUT).

The gated delta rule (docs/specs/qwen35.md section 4.7), per value head, token by token:
  S <- exp(g_t) S;  d_t = beta_t (v_t - S^T k_t);  S <- S + k_t d_t^T;  o_t = S^T q_t.
The chunked form below is the WY/UT formulation of the same recurrence (Yang et al., "Gated Delta
Networks", 2024, section 3), written here with chunks of 64 tokens aligned to the start of the call.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

RECURRENT_LAYOUT = "[HV, K, V] fp32 (key dim first)"
CONV_LAYOUT = "[D, W] raw in_proj_qkv outputs before SiLU, oldest first"
GDN_CHUNK = 64
# the revision of these kernels' bits, in a reader's identity (adapters.bits.kernel_versions):
# raised whenever a change here gives a chunk other bits, so that files spilled before it are
# not taken for this path's. 2: causal_conv1d's y contiguous (2026-12-06)
REVISION = 2


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x * rsqrt(sum(x^2) + eps) over the last dim, computed in fp32, returned in x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + eps)).to(x.dtype)


def _expand_heads(x: torch.Tensor, num_value_heads: int) -> torch.Tensor:
    """[T, Hk, K] -> [T, HV, K]: value head hv reads key head hv // (HV / Hk) (specs section 4.4)."""
    rep = num_value_heads // x.shape[1]
    return x if rep == 1 else x.repeat_interleave(rep, dim=1)


def recurrent_gated_delta_rule(q, k, v, g, beta, initial_state, scale=None):
    """Token-by-token gated delta rule in fp32 (the slow oracle).

    Args: q, k [T, Hk, K] (already L2-normalised); v [T, HV, V]; g [T, HV] fp32 log decay;
    beta [T, HV]; initial_state [HV, K, V] fp32; scale defaults to K ** -0.5.
    Returns (o [T, HV, V] in v's dtype, final_state [HV, K, V] fp32).
    """
    hv = v.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    qf = _expand_heads(q, hv).float() * scale
    kf = _expand_heads(k, hv).float()
    vf, bf, gf = v.float(), beta.float(), g.float()
    s = initial_state.float().clone()
    out = []
    for t in range(q.shape[0]):
        s = s * gf[t].exp()[:, None, None]
        m = torch.einsum("hk,hkv->hv", kf[t], s)
        d = bf[t][:, None] * (vf[t] - m)
        s = s + kf[t][:, :, None] * d[:, None, :]
        out.append(torch.einsum("hk,hkv->hv", qf[t], s))
    return torch.stack(out).to(v.dtype), s


def chunk_gated_delta_rule(q, k, v, g, beta, initial_state, scale=None, chunk=GDN_CHUNK):
    """Chunked gated delta rule in fp32 (the CPU path). Same contract as
    `recurrent_gated_delta_rule`; T is zero-padded to a multiple of `chunk` (padding has k = 0,
    beta = 0, g = 0, so it leaves the state unchanged).
    """
    t_len, hv = q.shape[0], v.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    pad = (-t_len) % chunk
    qf = F.pad(_expand_heads(q, hv).float() * scale, (0, 0, 0, 0, 0, pad))
    kf = F.pad(_expand_heads(k, hv).float(), (0, 0, 0, 0, 0, pad))
    vf = F.pad(v.float(), (0, 0, 0, 0, 0, pad))
    bf = F.pad(beta.float(), (0, 0, 0, pad))
    gf = F.pad(g.float(), (0, 0, 0, pad))
    n = qf.shape[0] // chunk
    # -> [HV, N, C, *]
    qc, kc, vc = (x.view(n, chunk, hv, -1).permute(2, 0, 1, 3) for x in (qf, kf, vf))
    bc, gc = (x.view(n, chunk, hv).permute(2, 0, 1) for x in (bf, gf))
    gcum = gc.cumsum(-1)                                       # [HV, N, C] log Gamma_i
    diff = gcum[..., :, None] - gcum[..., None, :]             # [HV, N, C, C] log(Gamma_i/Gamma_j)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = torch.where(lower, diff, torch.full_like(diff, float("-inf"))).exp()
    strict = ~lower | torch.eye(chunk, dtype=torch.bool, device=q.device)
    # (I + A) U = beta (V - Gamma K S0), A_ij = beta_i (Gamma_i/Gamma_j) k_i.k_j for j < i.
    a = (bc[..., None] * decay * (kc @ kc.transpose(-1, -2))).masked_fill(strict, 0.0)
    eye = torch.eye(chunk, dtype=torch.float32, device=q.device)
    t_inv = torch.linalg.solve_triangular(eye + a, eye.expand_as(a), upper=False,
                                          unitriangular=True)
    w = t_inv @ (bc[..., None] * gcum.exp()[..., None] * kc)   # [HV, N, C, K]
    u = t_inv @ (bc[..., None] * vc)                           # [HV, N, C, V]
    attn = (qc @ kc.transpose(-1, -2)) * decay                 # [HV, N, C, C], j <= i
    s = initial_state.float().clone()
    out = torch.empty_like(vc)
    for i in range(n):
        ui = u[:, i] - w[:, i] @ s                              # corrected deltas [HV, C, V]
        out[:, i] = (gcum[:, i].exp()[..., None] * qc[:, i]) @ s + attn[:, i] @ ui
        last = gcum[:, i, -1]
        kdec = kc[:, i] * (last[:, None] - gcum[:, i]).exp()[..., None]
        s = last.exp()[:, None, None] * s + kdec.transpose(-1, -2) @ ui
    o = out.permute(1, 2, 0, 3).reshape(n * chunk, hv, -1)[:t_len]
    return o.to(v.dtype), s


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor):
    """Depthwise causal conv with carried state, then SiLU (specs section 4.2).

    Args: x [T, D] raw in_proj_qkv outputs; weight [D, W] (tap W-1 is the current token);
    state [D, W] the last W raw inputs before this call (zeros at the start).
    Returns (y [T, D] in x's dtype, contiguous: one layout whether one sequence's y or a
    batch's stacked, kernels.conv_each, as fla's conv gives it; the CPU's reductions over
    its columns then run in one order either way; new_state [D, W] in x's dtype).
    """
    width = weight.shape[1]
    full = torch.cat([state.to(x.dtype), x.t()], dim=1)                # [D, W + T]
    y = F.conv1d(full[None, :, 1:], weight[:, None, :].to(x.dtype), groups=weight.shape[0])
    return F.silu(y[0].t()).contiguous(), full[:, -width:].contiguous()


def attend_ref(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, pos: int) -> torch.Tensor:
    """Twin of attention.table.attend_table in fp32: q [T, H, D] at positions [pos, pos + T) over
    rows [0, pos + T) of k_buf, v_buf [cap, Hkv, D], causal (key j visible to row t iff
    j <= pos + t), scale D^-0.5. Returns [T, H * D] in q's dtype."""
    t, h, d = q.shape
    end = pos + t
    group = h // k_buf.shape[1]
    k = k_buf[:end].float().repeat_interleave(group, dim=1)         # [end, H, D]
    v = v_buf[:end].float().repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,jhd->htj", q.float(), k) * d ** -0.5
    visible = torch.arange(end, device=q.device)[None, :] <= pos + torch.arange(t, device=q.device)[:, None]
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("htj,jhd->thd", probs, v).reshape(t, h * d).to(q.dtype)
