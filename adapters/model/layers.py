"""Qwen3.5 layers: zero-centred RMSNorm, SwiGLU MLP, gated full attention, Gated DeltaNet.

Every forward takes one sequence chunk x [T, hidden] and its state explicitly (no hidden caches),
following docs/specs/qwen35.md sections 3 (attention), 4 (GDN) and 5 (norms, MLP). Parameter
names are the Hugging Face names, so a checkpoint's state dict loads as it is.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from adapters.model import ops
from adapters.model.config import ModelConfig
from adapters.model.kernels import KernelSet
from adapters.model.ops import EAGER, Ops


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm: (x * rsqrt(mean(x^2) + eps) * (1 + w)) in fp32, cast to x's dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


class GatedRMSNorm(nn.Module):
    """The GDN output norm over one value head: plain weight (fp32), gate silu(z) (section 4.8)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return ops.gated_rms_norm(x, z, self.weight, self.eps)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, op: Ops = EAGER, gate_up=None) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]; gate_up: the fused [2I, hidden] weight (model.fuse)
        for one GEMM instead of two."""
        g, u = self.gate_up(x, op, gate_up)
        return op.down_proj(op.swiglu(g, u), self.down_proj.weight)

    def gate_up(self, x: torch.Tensor, op: Ops = EAGER, gate_up=None):
        """The gate and up projections of x [T, hidden]: (g, u), each [T, intermediate]
        (with the fused weight: column slices of one GEMM's output)."""
        if gate_up is None:
            return op.linear(x, self.gate_proj.weight), op.linear(x, self.up_proj.weight)
        return op.linear(x, gate_up).split(self.gate_proj.out_features, dim=-1)


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin [T, rotary_dim] for absolute positions [T], computed in fp32, cast to `dtype`
    (rotate-half layout: the 32 frequencies repeated twice; specs section 3.4)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, device=positions.device,
                                            dtype=torch.float32) / rotary_dim)
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def sdpa_backends(device: torch.device, dtype: torch.dtype) -> list[SDPBackend]:
    """The pinned SDPA backend (backends differ in bits, section 9.6): flash on CUDA in bf16/fp16,
    math otherwise (the CPU, and fp32 on CUDA, which flash does not take)."""
    half = dtype in (torch.bfloat16, torch.float16)
    return [SDPBackend.FLASH_ATTENTION] if device.type == "cuda" and half else [SDPBackend.MATH]


class Attention(nn.Module):
    """Gated full attention with partial RoPE over paged KV rows (pools [num_pages, G, Hkv, D])."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.cfg = cfg
        self.q_proj = nn.Linear(cfg.hidden_size, 2 * h * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, hkv * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, hkv * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def project(self, x: torch.Tensor, rope, op: Ops = EAGER, qkv=None):
        """x [T, hidden] -> q [T, H, D] (normed, rotated), k [T, Hkv, D] (normed, rotated),
        v [T, Hkv, D], gate [T, H, D] (a strided view). qkv: the fused [2HD + 2HkvD, hidden] weight
        (model.fuse) for one GEMM instead of three."""
        return self.heads(*self.project_rows(x, op, qkv), rope, op)

    def project_rows(self, x: torch.Tensor, op: Ops = EAGER, qkv=None):
        """The q/k/v projections of x [T, hidden]: (qg [T, 2HD], k [T, HkvD], v [T, HkvD])."""
        cfg = self.cfg
        h, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        if qkv is None:
            return (op.linear(x, self.q_proj.weight), op.linear(x, self.k_proj.weight),
                    op.linear(x, self.v_proj.weight))
        return op.linear(x, qkv).split([2 * h * d, hkv * d, hkv * d], dim=-1)

    def heads(self, qg, k, v, rope, op: Ops = EAGER):
        """project_rows' outputs of T rows (rows whose last dim is contiguous) as heads: q
        [T, H, D] (normed, rotated by rope: cos, sin [T, rotary_dim]), k [T, Hkv, D] (normed,
        rotated), v [T, Hkv, D], gate [T, H, D] (a strided view)."""
        cfg, t = self.cfg, qg.shape[0]
        h, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        qg = qg.view(t, h, 2 * d)                          # per head: [query 256 | gate 256]
        q, gate = qg[..., :d], qg[..., d:]                 # strided views: no copies
        q = op.norm_rope(q, self.q_norm.weight, self.q_norm.eps, *rope)
        k = op.norm_rope(k.view(t, hkv, d), self.k_norm.weight, self.k_norm.eps, *rope)
        return q, k, v.view(t, hkv, d), gate

    def attend(self, q, k, v, pos: int, pages) -> torch.Tensor:
        """Write k, v [T, Hkv, D] to rows [pos, pos + T) of the layer's pages (pages: a
        attention.paged.LayerPages) and attend q [T, H, D] over rows [0, pos + T) (causal,
        bottom-right aligned): [T, H * D].

        The rows are gathered from the pages into one contiguous tensor, so the kernel sees
        the same strides for the same (pos, T): results never depend on where pages lie."""
        t, h = q.shape[0], q.shape[1]
        end = pos + t
        pages.write(pos, k, v)
        k_rows, v_rows = pages.rows(end)
        keys = k_rows.permute(1, 0, 2)[None]              # [1, Hkv, end, D]
        values = v_rows.permute(1, 0, 2)[None]
        with sdpa_kernel(sdpa_backends(q.device, q.dtype)):
            o = F.scaled_dot_product_attention(q.permute(1, 0, 2)[None], keys, values,
                                               attn_mask=causal_lower_right(t, end),
                                               enable_gqa=k.shape[1] != h)
        return o[0].permute(1, 0, 2).reshape(t, -1)

    def output(self, o: torch.Tensor, gate: torch.Tensor, op: Ops = EAGER) -> torch.Tensor:
        """o [T, H * D] gated by sigmoid(gate [T, H, D]) -> o_proj -> [T, hidden]."""
        return op.linear(op.sigmoid_gate(o, gate), self.o_proj.weight)

    def forward(self, x, pos: int, pages, rope, op: Ops = EAGER) -> torch.Tensor:
        """x [T, hidden] at absolute positions [pos, pos + T); pages: the layer's
        attention.paged.LayerPages holding rows >= pos + T. Writes KV rows [pos, pos + T), returns
        [T, hidden] (see `attend`)."""
        q, k, v, gate = self.project(x, rope, op)
        return self.output(self.attend(q, k, v, pos, pages), gate, op)

    def mix(self, qg, k, v, pos: int, pages, rope, op: Ops = EAGER) -> torch.Tensor:
        """One sequence's part between the projections (project_rows' outputs of its T rows):
        heads, attention over its pages (writes KV rows [pos, pos + T)), the output gate:
        [T, H * D], what o_proj takes."""
        q, k, v, gate = self.heads(qg, k, v, rope, op)
        return op.sigmoid_gate(self.attend(q, k, v, pos, pages), gate)


class GatedDeltaNet(nn.Module):
    """Qwen3.5 linear-attention layer (section 4): conv -> L2-normed q/k -> gated delta rule."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hv = cfg.linear_num_value_heads
        self.cfg = cfg
        self.in_proj_qkv = nn.Linear(cfg.hidden_size, cfg.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(cfg.hidden_size, cfg.value_dim, bias=False)
        self.in_proj_b = nn.Linear(cfg.hidden_size, hv, bias=False)
        self.in_proj_a = nn.Linear(cfg.hidden_size, hv, bias=False)
        self.conv1d = nn.Conv1d(cfg.conv_dim, cfg.conv_dim, cfg.linear_conv_kernel_dim,
                                groups=cfg.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(hv))
        self.A_log = nn.Parameter(torch.zeros(hv))
        self.norm = GatedRMSNorm(cfg.linear_value_head_dim, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(cfg.value_dim, cfg.hidden_size, bias=False)

    def forward(self, x, conv_state, rec_state, kernels: KernelSet, op: Ops = EAGER, proj=None):
        """x [T, hidden]; conv_state [conv_dim, W] (x's dtype); rec_state [HV, K, V] fp32;
        proj: the fused [conv_dim + value_dim + 2HV, hidden] weight (model.fuse) for one GEMM
        instead of four. Returns (out [T, hidden], new conv_state, new rec_state); the inputs
        are not modified."""
        o, conv_state, rec_state = self.mix(*self.project(x, op, proj), conv_state, rec_state,
                                            kernels, op)
        return op.linear(o, self.out_proj.weight), conv_state, rec_state

    def project(self, x, op: Ops = EAGER, proj=None):
        """The input projections of x [T, hidden]: (qkv [T, conv_dim], z [T, value_dim], b, a
        [T, HV]); with the fused weight, strided column slices of one GEMM's output (the conv
        and the compiled gates read them as they lie)."""
        cfg, hv = self.cfg, self.cfg.linear_num_value_heads
        if proj is None:
            return (op.linear(x, self.in_proj_qkv.weight), op.linear(x, self.in_proj_z.weight),
                    op.linear(x, self.in_proj_b.weight), op.linear(x, self.in_proj_a.weight))
        return op.linear(x, proj).split([cfg.conv_dim, cfg.value_dim, hv, hv], dim=-1)

    def mix(self, qkv, z, b, a, conv_state, rec_state, kernels: KernelSet, op: Ops = EAGER):
        """One sequence's part between the projections (project's outputs of its T rows): the
        conv, the gates, the gated delta rule from (conv_state, rec_state), the gated norm.
        Returns (o [T, value_dim], new conv_state, new rec_state), what out_proj takes."""
        q, k, v, g, beta, conv_state = self.gates(qkv, b, a, conv_state, kernels, op)
        gdn = kernels.gdn_step if qkv.shape[0] == 1 else kernels.gdn   # decode: one kernel
        o, rec_state = gdn(q, k, v, g, beta, rec_state)
        return self.gated_norm(o, z, op), conv_state, rec_state

    def gates(self, qkv, b, a, conv_state, kernels: KernelSet, op: Ops = EAGER):
        """mix's first part: the conv over qkv [T, conv_dim] from conv_state [conv_dim, W]
        and the gates. Returns (q, k [T, HK, K], v [T, HV, V], g, beta [T, HV], new
        conv_state), what the gated delta rule takes."""
        cfg = self.cfg
        hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        kd, vd = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        weight = self.conv1d.weight[:, 0, :]
        if op.conv_gates is not None:            # the fused op set: conv and gates compiled
            return op.conv_gates(qkv, weight, conv_state, b, a, self.A_log, self.dt_bias,
                                 hk, kd, hv, vd)
        mixed, conv_state = kernels.conv(qkv, weight, conv_state)
        return (*op.gdn_gates(mixed, b, a, self.A_log, self.dt_bias, hk, kd, hv, vd),
                conv_state)

    def gates_many(self, qkv, b, a, conv_states, kernels: KernelSet, op: Ops = EAGER,
                   over_rows: bool = True):
        """`gates` for B sequences of T rows at once: qkv [B, T, conv_dim] (rows of unit
        stride along conv_dim: a fused projection's column slice viewed by sequence), b, a
        [B, T, HV], conv_states [B, conv_dim, W]. The conv in one call (KernelSet.convs),
        then the gates over all B * T rows in one call (op.gdn_gates), or with over_rows
        False one call a sequence on its rows of the conv's output (the same shapes and
        strides as `gates` alone); with op.conv_gates (the fused conv and gates of one
        sequence) `gates` one call a sequence. Returns (q, k [B, T, HK, K], v [B, T, HV, V],
        g, beta [B, T, HV], new conv_states [B, conv_dim, W]), what KernelSet.recurrences
        takes. Whether each sequence gets the bits `gates` gives it alone is measured, not
        assumed (runners.batch checks it)."""
        cfg = self.cfg
        n, t = qkv.shape[0], qkv.shape[1]
        if op.conv_gates is not None:
            outs = [self.gates(qkv[i], b[i], a[i], conv_states[i], kernels, op)
                    for i in range(n)]
            return tuple(torch.stack(x) for x in zip(*outs))
        hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        kd, vd = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        mixed, conv_states = kernels.convs(qkv, self.conv1d.weight[:, 0, :], conv_states)
        if not over_rows:                                  # mixed[i]: [T, conv_dim]
            outs = [op.gdn_gates(mixed[i], b[i], a[i], self.A_log, self.dt_bias, hk, kd, hv,
                                 vd) for i in range(n)]
            return (*(torch.stack(x) for x in zip(*outs)), conv_states)
        q, k, v, g, beta = op.gdn_gates(mixed.reshape(n * t, -1), b.reshape(n * t, hv),
                                        a.reshape(n * t, hv), self.A_log, self.dt_bias, hk,
                                        kd, hv, vd)
        return (q.reshape(n, t, hk, kd), k.reshape(n, t, hk, kd), v.reshape(n, t, hv, vd),
                g.reshape(n, t, hv), beta.reshape(n, t, hv), conv_states)

    def gated_norm(self, o, z, op: Ops = EAGER) -> torch.Tensor:
        """mix's last part: the recurrence's o [T, HV, V] normed and gated by z
        [T, value_dim]. Returns [T, value_dim]."""
        cfg, t = self.cfg, o.shape[0]
        z = z.reshape(t, cfg.linear_num_value_heads, cfg.linear_value_head_dim)
        return op.gated_rms_norm(o, z, self.norm.weight, self.norm.eps).reshape(t, cfg.value_dim)
