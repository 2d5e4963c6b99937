"""One GEMM for the projections that read the same input: per GDN layer in_proj_qkv, in_proj_z,
in_proj_b, in_proj_a (four GEMMs, two of them 16 columns wide, which cuBLAS runs at a few percent
of the GPU); per attention layer q_proj, k_proj, v_proj; per MLP gate_proj, up_proj. The chunk
runners use them with the fused small ops (runners.graphs); the eager forward keeps the four.

Memory: nothing is copied for good. The model's parameters become row views of the fused weight
(the same values, contiguous, so Qwen35.forward's calls and bits do not change), and a second
call finds the views and rebuilds the same fused weights. Fuse after the model is on its
device and in its dtype: `.to()` afterwards would leave the fused weights behind.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from adapters.model.config import FULL


@dataclass(frozen=True)
class FusedProjections:
    """Per layer index i, weights [rows, hidden] in the model's dtype and device:
    gdn_in[i]: rows of in_proj_qkv [conv_dim], in_proj_z [value_dim], in_proj_b [HV],
    in_proj_a [HV]; attn_in[i]: q_proj [2 * H * D], k_proj [Hkv * D], v_proj [Hkv * D];
    mlp_in[i]: gate_proj [I], up_proj [I]."""

    gdn_in: dict[int, torch.Tensor]
    attn_in: dict[int, torch.Tensor]
    mlp_in: dict[int, torch.Tensor]


def _already(weights: list[torch.Tensor]) -> torch.Tensor | None:
    """The fused weight when `weights` already are consecutive row views of one storage."""
    first = weights[0]
    ptr, offset, cols = first.untyped_storage().data_ptr(), first.storage_offset(), first.shape[1]
    for w in weights:
        if (w.untyped_storage().data_ptr() != ptr or w.storage_offset() != offset
                or not w.is_contiguous() or w.shape[1] != cols):
            return None
        offset += w.numel()
    rows = sum(w.shape[0] for w in weights)
    return first.detach().new_empty(0).set_(first.untyped_storage(), first.storage_offset(),
                                            (rows, cols))


def _fuse(linears: list[torch.nn.Linear]) -> torch.Tensor:
    params = [m.weight for m in linears]
    fused = _already([p.data for p in params])
    if fused is not None:
        return fused
    fused = torch.cat([p.data for p in params])
    row = 0
    for p in params:                      # re-point each parameter at its rows of `fused`
        n = p.shape[0]
        p.data = fused[row:row + n]
        row += n
    return fused


@torch.no_grad()
def fuse_projections(model) -> FusedProjections:
    """The fused weights of `model` (a Qwen35); its parameters become views of them."""
    gdn, attn, mlp = {}, {}, {}
    for i, layer in enumerate(model.layers):
        if layer.layer_type == FULL:
            a = layer.self_attn
            attn[i] = _fuse([a.q_proj, a.k_proj, a.v_proj])
        else:
            g = layer.linear_attn
            gdn[i] = _fuse([g.in_proj_qkv, g.in_proj_z, g.in_proj_b, g.in_proj_a])
        mlp[i] = _fuse([layer.mlp.gate_proj, layer.mlp.up_proj])
    return FusedProjections(gdn, attn, mlp)
