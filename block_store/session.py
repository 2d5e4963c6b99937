"""One session's memory: ids, committed length, KV buffers, GDN states, checkpoints; grow,
snapshot, and the scratch copies forks read in.

Layouts (block_store.layout, asserted in `check_layout`):
- KV buffer per attention layer: k and v [capacity, Hkv, D] in the spec's dtype, each a
  contiguous view of one block a session (layout.alloc_kv); rows [0, C) are committed, rows
  above C are scratch for forks. Capacity grows in steps of `kv_step` rows.
- GDN state per linear layer: conv [conv_dim, W] and recurrent [HV, K, V] fp32, after token C.
- Checkpoint: a copy of every GDN state at a grid line P <= C (KV rows need none: rows below a
  rollback point stay valid).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .layout import (
    RECURRENT_LAYOUT,
    GdnState,
    KvState,
    StateSpec,
    alloc_kv,
    clone_gdn,
    copy_rows,
    round_up,
    zero_gdn,
)


@dataclass
class Checkpoint:
    """GDN states after token `pos` (a grid line); `episode_start` marks the checkpoint at the
    start of the current episode (kept when others are dropped)."""

    pos: int
    gdn: GdnState
    episode_start: bool = False


@dataclass
class SessionState:
    """Everything held for one session.

    ids: the session's ids as the host served and produced them; committed: C, a multiple of the
    grid; pending_lines: grid line above C where a checkpoint is due (handed down by the reader:
    ends of turns' prompts) -> whether it starts an episode; last_used: the table's LRU clock.
    """

    ids: list[int]
    committed: int
    kv: KvState
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


def new_state(spec: StateSpec) -> SessionState:
    """An empty session: no ids, C = 0, zero GDN states, no KV rows yet."""
    return SessionState(ids=[], committed=0, kv=alloc_kv(spec, 0), gdn=zero_gdn(spec))


def ensure_capacity(state: SessionState, spec: StateSpec, rows: int, kv_step: int) -> None:
    """Grow the KV buffers to hold `rows` rows (rounded up to `kv_step`), keeping rows [0, C)."""
    if rows <= state.capacity or not state.kv:
        return
    new = alloc_kv(spec, round_up(rows, kv_step))
    copy_rows(new, state.kv, state.committed)
    state.kv = new


def scratch_from(state: SessionState, spec: StateSpec, cp: Checkpoint | None, line: int,
                 rows: int, kv_step: int) -> SessionState:
    """A scratch session at checkpoint `cp` (or 0 without one) holding ids[:line], with KV rows
    [0, cp.pos) copied and room for `rows` rows; the session itself is not changed."""
    p = cp.pos if cp else 0
    kv = alloc_kv(spec, round_up(max(rows, 1), kv_step))
    copy_rows(kv, state.kv, p)
    gdn = clone_gdn(cp.gdn) if cp else zero_gdn(spec)
    return SessionState(ids=state.ids[:line], committed=p, kv=kv, gdn=gdn)


def check_layout(state: SessionState, spec: StateSpec) -> None:
    """Assert the tensor layouts named in this module's docstring (shapes and dtypes)."""
    for conv, rec in state.gdn:
        assert tuple(conv.shape) == (spec.conv_dim, spec.conv_width), conv.shape
        assert tuple(rec.shape) == spec.recurrent_shape and rec.dtype == torch.float32, \
            RECURRENT_LAYOUT
    for k, v in state.kv:
        assert k.shape[1:] == spec.kv_row_shape and k.shape == v.shape


def state_bytes(state: SessionState) -> int:
    """Resident bytes: KV capacity x bytes per row, GDN states, checkpoints."""
    kv = sum(k.nbytes + v.nbytes for k, v in state.kv)
    gdn = sum(c.nbytes + r.nbytes for c, r in state.gdn)
    return kv + gdn * (1 + len(state.checkpoints))    # a checkpoint: a copy of the GDN states
