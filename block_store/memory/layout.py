"""The layouts of a session's state, from a small spec of shapes and dtypes (no model object).

Per layer, in layer order, one of two kinds:
- attention: a KV buffer pair k, v [capacity, Hkv, D] in `dtype`; rows [0, C) are committed,
  rows above C are scratch for forks;
- gdn (Gated DeltaNet): conv state [conv_dim, W] in `dtype` (the last W raw conv inputs) and
  recurrent state [HV, K, V] fp32 (key dimension first), both after token C.

The committed state's tensors carry names in layer order (`state_names`): layers.{i}.key /
.value for attention layers, layers.{i}.conv / .recurrent for GDN layers; `pack` gives views of
them, `compare` checks two packed states bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

ATTENTION, GDN = "attention", "gdn"
RECURRENT_LAYOUT = "[HV, K, V] fp32 (key dim first)"

GdnState = list[tuple[torch.Tensor, torch.Tensor]]     # per GDN layer (conv, recurrent)
KvState = list[tuple[torch.Tensor, torch.Tensor]]      # per attention layer (k, v)


@dataclass(frozen=True)
class StateSpec:
    """What a session's state looks like. layer_kinds: per layer ATTENTION or GDN, in layer
    order; num_kv_heads (Hkv), head_dim (D): a KV row; conv_dim, conv_width (W): a conv state;
    num_value_heads (HV), key_head_dim (K), value_head_dim (V): a recurrent state; dtype: KV
    rows and conv states (recurrent states are fp32); device: where states live."""

    layer_kinds: tuple[str, ...]
    num_kv_heads: int
    head_dim: int
    conv_dim: int
    conv_width: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    dtype: torch.dtype
    device: torch.device

    def __post_init__(self) -> None:
        bad = [k for k in self.layer_kinds if k not in (ATTENTION, GDN)]
        if bad:
            raise ValueError(f"unknown layer kind {bad[0]!r} (expected {ATTENTION!r} or {GDN!r})")
        object.__setattr__(self, "device", torch.device(self.device))

    @property
    def num_attention(self) -> int:
        return self.layer_kinds.count(ATTENTION)

    @property
    def num_gdn(self) -> int:
        return self.layer_kinds.count(GDN)

    @property
    def kv_row_shape(self) -> tuple[int, int]:
        """[Hkv, D]: one KV row of one attention layer."""
        return (self.num_kv_heads, self.head_dim)

    @property
    def recurrent_shape(self) -> tuple[int, int, int]:
        return (self.num_value_heads, self.key_head_dim, self.value_head_dim)


def round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def zero_gdn(spec: StateSpec) -> GdnState:
    """GDN states before the first token: zeros, conv in spec.dtype, recurrent in fp32."""
    return [(torch.zeros(spec.conv_dim, spec.conv_width, device=spec.device, dtype=spec.dtype),
             torch.zeros(spec.recurrent_shape, device=spec.device, dtype=torch.float32))
            for _ in range(spec.num_gdn)]


def clone_gdn(gdn: GdnState) -> GdnState:
    return [(c.clone(), r.clone()) for c, r in gdn]


def alloc_kv(spec: StateSpec, rows: int) -> KvState:
    """Per attention layer a pair of [rows, Hkv, D] buffers (uninitialised), each a contiguous
    view of one block [num_attention, 2, rows, Hkv, D]: one device allocation rather than two a
    layer. On the H200 a chunk that grew twelve buffers cost 1.5 ms more whatever their size
    (so not the copy), one that grows the block 0.5 ms more (BENCHMARKS.md)."""
    block = torch.empty(spec.num_attention, 2, rows, *spec.kv_row_shape, device=spec.device,
                        dtype=spec.dtype)
    return [(block[j, 0], block[j, 1]) for j in range(spec.num_attention)]


def copy_rows(dst: KvState, src: KvState, rows: int) -> None:
    """KV rows [0, rows) of every buffer of src into dst (one multi-tensor copy)."""
    if rows and dst:
        torch._foreach_copy_([x[:rows] for pair in dst for x in pair],
                             [x[:rows] for pair in src for x in pair])


def state_names(spec: StateSpec) -> list[str]:
    """Names of the committed state's tensors, in layer order: layers.{i}.key / .value
    [C, Hkv, D] (attention), layers.{i}.conv [conv_dim, W] and layers.{i}.recurrent [HV, K, V]
    fp32 (GDN)."""
    names = []
    for i, kind in enumerate(spec.layer_kinds):
        pair = ("key", "value") if kind == ATTENTION else ("conv", "recurrent")
        names += [f"layers.{i}.{p}" for p in pair]
    return names


def pack(spec: StateSpec, kv: KvState, gdn: GdnState, committed: int) -> dict[str, torch.Tensor]:
    """name -> tensor view of KV rows [0, C) and the GDN states (`state_names` order)."""
    out, kv_it, gdn_it = {}, iter(kv), iter(gdn)
    for i, kind in enumerate(spec.layer_kinds):
        if kind == ATTENTION:
            k, v = next(kv_it)
            out[f"layers.{i}.key"], out[f"layers.{i}.value"] = k[:committed], v[:committed]
        else:
            conv, rec = next(gdn_it)
            out[f"layers.{i}.conv"], out[f"layers.{i}.recurrent"] = conv, rec
    return out


class ExactnessError(AssertionError):
    """A committed state differs from a fresh prefill; the message names the tensor and index."""


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
