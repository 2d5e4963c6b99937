"""The exactness oracle: a fresh prefill of ids[:C] on the grid by its own plain loop.

It shares no state-handling code with the reader (no SessionState, no capacity growth, no
checkpoints), only the model, so it can catch the reader's mistakes.
"""
from __future__ import annotations

import torch

from .model.qwen35 import Qwen35


class ExactnessError(AssertionError):
    """A committed state differs from a fresh prefill; the message names the tensor and index."""


def state_names(model: Qwen35) -> list[str]:
    """Names of the committed state's tensors, in layer order:
    layers.{i}.key / .value [C, Hkv, D] (full attention), layers.{i}.conv [conv_dim, W] and
    layers.{i}.recurrent [HV, K, V] fp32 (GDN)."""
    names = []
    for i in range(model.cfg.num_hidden_layers):
        pair = ("key", "value") if i in model.cfg.full_layers else ("conv", "recurrent")
        names += [f"layers.{i}.{p}" for p in pair]
    return names


def pack(model: Qwen35, kv, gdn, committed: int) -> dict[str, torch.Tensor]:
    """name -> tensor view of KV rows [0, C) and the GDN states."""
    out, kv_it, gdn_it = {}, iter(kv), iter(gdn)
    for i in range(model.cfg.num_hidden_layers):
        if i in model.cfg.full_layers:
            k, v = next(kv_it)
            out[f"layers.{i}.key"], out[f"layers.{i}.value"] = k[:committed], v[:committed]
        else:
            conv, rec = next(gdn_it)
            out[f"layers.{i}.conv"], out[f"layers.{i}.recurrent"] = conv, rec
    return out


def fresh_prefill(model: Qwen35, ids: list[int], grid: int, graphs=None) -> dict[str, torch.Tensor]:
    """State after prefilling `ids` (len a multiple of `grid`) chunk by chunk from zero, through
    `graphs` (the reader's model.runners.Runners, or a ChunkGraphs for T = grid) when given, else the eager forward."""
    cfg, dev, dt = model.cfg, model.device, model.dtype
    n = len(ids)
    assert n % grid == 0, "fresh_prefill takes whole chunks"
    shape = (n, cfg.num_key_value_heads, cfg.head_dim)
    kv = [(torch.zeros(shape, device=dev, dtype=dt), torch.zeros(shape, device=dev, dtype=dt))
          for _ in cfg.full_layers]
    hv, kd, vd = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    gdn = [(torch.zeros(cfg.conv_dim, cfg.linear_conv_kernel_dim, device=dev, dtype=dt),
            torch.zeros(hv, kd, vd, device=dev, dtype=torch.float32)) for _ in cfg.linear_layers]
    for start in range(0, n, grid):
        chunk = torch.tensor(ids[start:start + grid], dtype=torch.long)
        if graphs is not None:               # the runner stages host ids itself
            _, gdn = graphs.run(chunk, start, kv, gdn)
        else:
            _, gdn = model(chunk.to(dev), start, kv, gdn)
    return pack(model, kv, gdn, n)


def compare(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Raise ExactnessError at the first tensor (in `want`'s order) that is not bit-equal."""
    for name, w in want.items():
        g = got.get(name)
        if g is None:
            raise ExactnessError(f"{name}: missing")
        if g.shape != w.shape or g.dtype != w.dtype:
            raise ExactnessError(f"{name}: shape/dtype {list(g.shape)} {g.dtype}, "
                                 f"expected {list(w.shape)} {w.dtype}")
        diff = (g.contiguous().view(torch.uint8) != w.contiguous().view(torch.uint8)
                if g.numel() else torch.zeros(0, dtype=torch.bool))
        if diff.any():
            flat = (g != w).flatten().nonzero()
            idx = int(flat[0]) if flat.numel() else 0
            pos = list(torch.unravel_index(torch.tensor(idx), g.shape))
            raise ExactnessError(f"{name}: differs at index {[int(p) for p in pos]}: "
                                 f"{g.flatten()[idx].item()!r} != {w.flatten()[idx].item()!r}")
