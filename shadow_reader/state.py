"""One session's tensors: KV buffers, recurrent and conv states, checkpoints; grow and snapshot.

Layouts (asserted in `check_layout`):
- KV buffer per full-attention layer: k and v [capacity, Hkv, D] in the model dtype, each a
  contiguous view of one block a session (`alloc_kv`); rows [0, C) are committed, rows above C
  are scratch for forks. Capacity grows in steps of `kv_step` rows.
- GDN state per linear layer: conv [conv_dim, W] (model dtype, the last W raw conv inputs) and
  recurrent [HV, K, V] fp32 (ref.RECURRENT_LAYOUT), both after token C.
- Checkpoint: a copy of every GDN state at a grid line P <= C (KV rows need none: rows below a
  rollback point stay valid).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .model.config import ModelConfig
from .model.ref import RECURRENT_LAYOUT

GdnState = list[tuple[torch.Tensor, torch.Tensor]]   # per linear layer (conv, recurrent)


@dataclass
class Checkpoint:
    """GDN states after token `pos` (a grid line); `episode_start` marks the checkpoint at the
    start of the current episode (kept when others are dropped)."""

    pos: int
    gdn: GdnState
    episode_start: bool = False


@dataclass
class SessionState:
    """Everything the reader holds for one session.

    ids: the session's ids as the host served and produced them; committed: C, a multiple of the
    grid; pending_lines: grid line above C where a checkpoint is due (ends of turns' prompts)
    -> whether it starts an episode.
    """

    ids: list[int]
    committed: int
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    gdn: GdnState
    checkpoints: list[Checkpoint] = field(default_factory=list)
    pending_lines: dict[int, bool] = field(default_factory=dict)
    last_used: int = 0

    @property
    def capacity(self) -> int:
        return self.kv[0][0].shape[0] if self.kv else 0

    @property
    def backlog(self) -> int:
        return len(self.ids) - self.committed


def zero_gdn(cfg: ModelConfig, device, dtype) -> GdnState:
    """GDN states before the first token: zeros, conv in `dtype`, recurrent in fp32."""
    hv, kd, vd = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    return [(torch.zeros(cfg.conv_dim, cfg.linear_conv_kernel_dim, device=device, dtype=dtype),
             torch.zeros(hv, kd, vd, device=device, dtype=torch.float32))
            for _ in cfg.linear_layers]


def clone_gdn(gdn: GdnState) -> GdnState:
    return [(c.clone(), r.clone()) for c, r in gdn]


def round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def alloc_kv(cfg: ModelConfig, rows: int, device, dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per full-attention layer a pair of [rows, Hkv, D] buffers (uninitialised), each a
    contiguous view of one block [num_full, 2, rows, Hkv, D]: one device allocation rather
    than two a layer. On the H200 a chunk that grew twelve buffers cost 1.5 ms more whatever
    their size (so not the copy), one that grows the block 0.5 ms more (BENCHMARKS.md)."""
    block = torch.empty(len(cfg.full_layers), 2, rows, cfg.num_key_value_heads, cfg.head_dim,
                        device=device, dtype=dtype)
    return [(block[j, 0], block[j, 1]) for j in range(len(cfg.full_layers))]


def copy_rows(dst: list, src: list, rows: int) -> None:
    """KV rows [0, rows) of every buffer of src into dst (one multi-tensor copy)."""
    if rows and dst:
        torch._foreach_copy_([x[:rows] for pair in dst for x in pair],
                             [x[:rows] for pair in src for x in pair])


def new_state(cfg: ModelConfig, device, dtype) -> SessionState:
    """An empty session: no ids, C = 0, zero GDN states, no KV rows yet."""
    return SessionState(ids=[], committed=0, kv=alloc_kv(cfg, 0, device, dtype),
                        gdn=zero_gdn(cfg, device, dtype))


def ensure_capacity(state: SessionState, cfg: ModelConfig, rows: int, kv_step: int) -> None:
    """Grow the KV buffers to hold `rows` rows (rounded up to `kv_step`), keeping rows [0, C)."""
    if rows <= state.capacity:
        return
    k0 = state.kv[0][0] if state.kv else None
    if k0 is None:
        return
    new = alloc_kv(cfg, round_up(rows, kv_step), k0.device, k0.dtype)
    copy_rows(new, state.kv, state.committed)
    state.kv = new


def check_layout(state: SessionState, cfg: ModelConfig) -> None:
    """Assert the tensor layouts named in this module's docstring (shapes and dtypes)."""
    hv, kd, vd = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    for conv, rec in state.gdn:
        assert tuple(conv.shape) == (cfg.conv_dim, cfg.linear_conv_kernel_dim), conv.shape
        assert tuple(rec.shape) == (hv, kd, vd) and rec.dtype == torch.float32, RECURRENT_LAYOUT
    for k, v in state.kv:
        assert k.shape[1:] == (cfg.num_key_value_heads, cfg.head_dim) and k.shape == v.shape


def state_bytes(state: SessionState) -> int:
    """Resident bytes: KV capacity x bytes per row, GDN states, checkpoints."""
    kv = sum(k.nbytes + v.nbytes for k, v in state.kv)
    gdn = sum(c.nbytes + r.nbytes for c, r in state.gdn)
    return kv + gdn * (1 + len(state.checkpoints))    # a checkpoint: a copy of the GDN states
