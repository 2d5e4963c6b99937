"""The reader's unit of work on one session: read one grid chunk and commit it.

Functions over (adapter, config, state) passed as arguments; the reader and forks share them.
"""
from __future__ import annotations

from dataclasses import dataclass

from adapters import Adapter
from block_store import SessionState
from block_store.checkpoints import commit_chunk
from block_store.session import ensure_capacity


@dataclass(frozen=True)
class ReaderConfig:
    """grid: G, the chunk length and the only lines C stops at (a multiple of 64, so fla's
    64-token chunks line up on CUDA, docs/specs/qwen35.md section 9.2); kv_step: KV buffer
    growth in rows; max_checkpoints: checkpoints kept per session (>= 1)."""

    grid: int = 512
    kv_step: int = 8192
    max_checkpoints: int = 6

    def __post_init__(self) -> None:
        if self.grid < 64 or self.grid % 64:
            raise ValueError(f"grid must be a positive multiple of 64, got {self.grid}")
        if self.kv_step < 1:
            raise ValueError(f"kv_step must be >= 1, got {self.kv_step}")
        if self.max_checkpoints < 1:
            raise ValueError(f"max_checkpoints must be >= 1, got {self.max_checkpoints}")


def read_chunk(adapter: Adapter, rcfg: ReaderConfig, st: SessionState) -> None:
    """Advance C by one grid chunk: forward ids[C:C+G] at C, commit the GDN states, and take the
    checkpoint due at the new C. Requires a backlog of at least G. KV rows above C are written
    first; C and the GDN states change only after the forward returned."""
    c, g = st.committed, rcfg.grid
    assert st.backlog >= g, "read_chunk needs a whole chunk of backlog"
    ensure_capacity(st, adapter.spec, c + g, rcfg.kv_step)
    gdn = adapter.read_chunk(st.ids[c:c + g], c, st.kv, st.gdn)
    commit_chunk(st, gdn, g, rcfg.max_checkpoints)
