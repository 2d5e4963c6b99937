"""The two kernel paths for the GDN recurrence and the short conv, chosen once per model.

- "torch": adapters.model.ref (chunked fp32 form): the CPU path and the oracle.
- "fla": flash-linear-attention's Triton kernels on CUDA (`pip install shadow-reader[cuda]`).

Both take and return the same layouts (ref.RECURRENT_LAYOUT, ref.CONV_LAYOUT), so a state written by
one can be read by the other within tolerance (bit-exactness holds only within one path).
Exactness on CUDA (docs/specs/qwen35.md section 9): FLA_FLASH_QLA=0 is forced before fla is
imported, the q/k L2 norm is done by us (`use_qk_l2norm_in_kernel=False`, whose autotuned
kernel changes bits), and the grid is a multiple of 64 so fla's 64-token chunks line up with
ours. fla's autotuned configs are loaded from (and written to) a pinned directory
(model.autotune.env_dir: by default ~/.cache/shadow-reader/autotune, SHADOW_AUTOTUNE_DIR=off
for none), so another process picks the same kernels.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch

from adapters.model import ref


@dataclass(frozen=True)
class KernelSet:
    """gdn(q, k, v, g, beta, state) -> (o [T, HV, V], state [HV, K, V] fp32);
    gdn_step: the same contract for one token (a decode step: the token-by-token recurrence,
    one kernel instead of the chunked form's several; never used for committed chunks);
    conv(x [T, D], weight [D, W], state [D, W]) -> (y [T, D] after SiLU, state [D, W]);
    gdn_many: gdn for B sequences of T rows each at once, every input with a leading [B]
    (q [B, T, H, K], ..., state [B, HV, K, V]) -> (o [B, T, HV, V], state [B, HV, K, V]
    fp32); on fla one call (its kernels' grids run a program per sequence and head), in
    pure torch gdn per sequence (`gdn_each`); conv_many: conv for B sequences at once (x
    [B, T, D], state [B, D, W]) -> (y [B, T, D], state [B, D, W]); on fla one call, in pure
    torch conv per sequence (`conv_each`). Whether each sequence gets the bits gdn and conv
    give it alone is measured, not assumed (runners.batch checks it)."""

    name: str
    gdn: Callable
    conv: Callable
    gdn_step: Callable
    gdn_many: Callable | None = None
    conv_many: Callable | None = None

    def recurrences(self, q, k, v, g, beta, state):
        """gdn_many where the set has it, else `gdn_each` over gdn; same contract."""
        if self.gdn_many is not None:
            return self.gdn_many(q, k, v, g, beta, state)
        return gdn_each(self.gdn, q, k, v, g, beta, state)

    def convs(self, x, weight, state):
        """conv_many where the set has it, else `conv_each` over conv; same contract."""
        if self.conv_many is not None:
            return self.conv_many(x, weight, state)
        return conv_each(self.conv, x, weight, state)


def gdn_each(gdn: Callable, q, k, v, g, beta, state):
    """KernelSet.gdn_many's contract by one `gdn` call per sequence (the pure-torch twin of
    fla's one call): inputs with a leading [B]; returns (o [B, T, HV, V], state [B, HV, K, V]
    fp32)."""
    outs = [gdn(q[b], k[b], v[b], g[b], beta[b], state[b]) for b in range(q.shape[0])]
    return torch.stack([o for o, _ in outs]), torch.stack([s for _, s in outs])


def conv_each(conv: Callable, x, weight, state):
    """KernelSet.conv_many's contract by one `conv` call per sequence (the pure-torch twin of
    fla's one call): x [B, T, D], state [B, D, W]; returns (y [B, T, D], state [B, D, W])."""
    outs = [conv(x[b], weight, state[b]) for b in range(x.shape[0])]
    return torch.stack([y for y, _ in outs]), torch.stack([s for _, s in outs])


TORCH = KernelSet("torch", ref.chunk_gated_delta_rule, ref.causal_conv1d,
                  ref.recurrent_gated_delta_rule)     # gdn_many, conv_many: one call a sequence


def _fla_kernels() -> KernelSet:
    os.environ["FLA_FLASH_QLA"] = "0"       # a kernel family of other numerics (section 9.4)
    os.environ.pop("FLA_INTRACARD_CP", None)
    from adapters.model.autotune import pin_from_env
    pin_from_env()                             # before fla is imported (model.autotune)
    from fla.modules.causal_conv1d import causal_conv1d as fla_conv
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_step

    def gdn(q, k, v, g, beta, state):
        o, s = fla_gdn(q[None], k[None], v[None], g=g[None].float(), beta=beta[None],
                       initial_state=state[None].float(), output_final_state=True,
                       use_qk_l2norm_in_kernel=False)
        return o[0], s[0]

    def gdn_many(q, k, v, g, beta, state):                 # [B, T, ...]: one call
        return fla_gdn(q, k, v, g=g.float(), beta=beta, initial_state=state.float(),
                       output_final_state=True, use_qk_l2norm_in_kernel=False)

    def gdn_step(q, k, v, g, beta, state):
        o, s = fla_step(q[None], k[None], v[None], g=g[None].float(), beta=beta[None],
                        initial_state=state[None].float(), output_final_state=True,
                        use_qk_l2norm_in_kernel=False)
        return o[0], s[0]

    def conv(x, weight, state):
        y, s = fla_conv(x[None], weight=weight, initial_state=state[None].to(x.dtype),
                        output_final_state=True, activation="silu")
        return y[0], s[0]

    def conv_many(x, weight, state):                       # [B, T, D]: one call
        return fla_conv(x, weight=weight, initial_state=state.to(x.dtype),
                        output_final_state=True, activation="silu")

    return KernelSet("fla", gdn, conv, gdn_step, gdn_many, conv_many)


def select_kernels(device: torch.device, name: str | None = None) -> KernelSet:
    """Pick the kernel path: "torch" on CPU, "fla" on CUDA unless `name` says otherwise.

    Raises ImportError naming the package when "fla" is asked for and fla-core is missing,
    ValueError for an unknown name or fla on a non-CUDA device.
    """
    name = name or ("fla" if device.type == "cuda" else "torch")
    if name == "torch":
        return TORCH
    if name != "fla":
        raise ValueError(f"unknown kernel path {name!r} (expected 'torch' or 'fla')")
    if device.type != "cuda":
        raise ValueError(f"the fla kernels need a CUDA device, got {device}")
    try:
        return _fla_kernels()
    except ImportError as e:
        raise ImportError("the CUDA path needs fla-core: pip install 'shadow-reader[cuda]'") from e
