"""How far bfloat16 drifts from float32 on the CPU, layer by layer (why the CUDA path's bf16
logits are ~0.1 off fp32 on the random presets: docs/gpu-check.md).

    python -m evals.bf16_trace --ids .devdata/claudecode_vsla_5f8cbb78.npz --layers 8

Runs the first --layers layers of a preset on 512 real ids in fp32 and in bf16 (same stored
weights, pure-torch kernels) and prints the relative RMS difference of the residual stream after
each layer, and of the intermediate tensors of the first GDN block.
"""
from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import torch
import torch.nn.functional as F

from adapters import spec_for
from adapters.model import ref
from adapters.model.config import FULL, PRESETS
from adapters.model.layers import rope_cos_sin
from adapters.model.qwen35 import ModelInfo
from adapters.model.weights import build_model, random_tensors
from block_store.layout import zero_gdn


def residuals(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """The residual stream after each layer, as fp32."""
    cfg, t = model.cfg, ids.shape[0]
    x = model.embed_tokens(ids)
    rope = rope_cos_sin(torch.arange(t), cfg.rotary_dim, cfg.rope_theta, x.dtype)
    shape = (t, cfg.num_key_value_heads, cfg.head_dim)
    kv = iter([(torch.zeros(shape, dtype=model.dtype), torch.zeros(shape, dtype=model.dtype))
               for _ in cfg.full_layers])
    gdn, out = iter(zero_gdn(spec_for(cfg, "cpu", model.dtype))), []
    with torch.no_grad():
        for layer in model.layers:
            h = layer.input_layernorm(x)
            if layer.layer_type == FULL:
                h = layer.self_attn(h, 0, *next(kv), rope)
            else:
                h = layer.linear_attn(h, *next(gdn), model.kernels)[0]
            x = x + h
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            out.append(x.float())
    return out


def gdn_parts(model, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Intermediate tensors of the first layer's GDN block."""
    cfg, t = model.cfg, ids.shape[0]
    layer = model.layers[0]
    g = layer.linear_attn
    hk, hv, kd = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim
    with torch.no_grad():
        h = layer.input_layernorm(model.embed_tokens(ids))
        mixed = g.in_proj_qkv(h)
        conv, _ = ref.causal_conv1d(mixed, g.conv1d.weight[:, 0, :],
                                    torch.zeros(cfg.conv_dim, 4, dtype=model.dtype))
        q, k, v = conv.split([cfg.key_dim, cfg.key_dim, cfg.value_dim], -1)
        q, k = ref.l2norm(q.reshape(t, hk, kd)), ref.l2norm(k.reshape(t, hk, kd))
        beta = torch.sigmoid(g.in_proj_b(h))
        decay = -g.A_log.float().exp() * F.softplus(g.in_proj_a(h).float() + g.dt_bias.float())
        o, _ = ref.chunk_gated_delta_rule(q, k, v.reshape(t, hv, -1), decay, beta,
                                          torch.zeros(hv, kd, cfg.linear_value_head_dim))
        normed = g.norm(o, g.in_proj_z(h).view(t, hv, -1))
        out = g.out_proj(normed.reshape(t, cfg.value_dim))
    return {"in_proj_qkv": mixed, "conv": conv, "q": q, "beta": beta, "gdn_out": o,
            "gated_norm": normed, "out_proj": out}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).pow(2).mean().sqrt() / a.pow(2).mean().sqrt()).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ids", required=True)
    ap.add_argument("--preset", default="qwen3.5-0.8b")
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    cfg = dataclasses.replace(PRESETS[args.preset], num_hidden_layers=args.layers, layer_types=())
    tensors = random_tensors(cfg)
    info = ModelInfo("trace", "", True)
    m32, m16 = (build_model(cfg, tensors, info, "cpu", dt) for dt in (torch.float32,
                                                                      torch.bfloat16))
    ids = torch.tensor(np.load(args.ids)["ids"][:512].tolist())
    p32, p16 = gdn_parts(m32, ids), gdn_parts(m16, ids)
    for name in p32:
        print(f"layer 0 GDN {name:<12} rel RMS {rel(p32[name], p16[name]):.4f}")
    for i, (a, b) in enumerate(zip(residuals(m32, ids), residuals(m16, ids))):
        print(f"after layer {i:<3} rel RMS {rel(a, b):.4f}")


if __name__ == "__main__":
    main()
