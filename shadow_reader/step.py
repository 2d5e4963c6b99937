"""The reader's unit of work on one session: read one grid chunk and commit it.

Functions over (model, config, state) passed as arguments; the reader and forks share them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import checkpoints
from .model.qwen35 import Qwen35
from .state import Checkpoint, SessionState, clone_gdn, ensure_capacity


@dataclass(frozen=True)
class ReaderConfig:
    """grid: G, the chunk length and the only lines C stops at (a multiple of 64, so fla's
    64-token chunks line up on CUDA, specs/qwen35.md section 9.2); kv_step: KV buffer growth in
    rows; max_checkpoints: checkpoints kept per session (>= 1)."""

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


def ids_tensor(ids: list[int], device) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.long, device=device)


def read_chunk(model: Qwen35, rcfg: ReaderConfig, st: SessionState, graphs=None) -> None:
    """Advance C by one grid chunk: forward ids[C:C+G] at C (through `graphs`, a
    model.graphs.ChunkGraphs for T = G, when given), commit the GDN states, and take the
    checkpoint due at the new C. Requires a backlog of at least G. KV rows above C are written
    first; C and the GDN states change only after the forward returned."""
    c, g = st.committed, rcfg.grid
    assert st.backlog >= g, "read_chunk needs a whole chunk of backlog"
    ensure_capacity(st, model.cfg, c + g, rcfg.kv_step)
    if graphs is not None:        # ids stay on the host: the graph runner stages them itself
        _, gdn = graphs.run(st.ids[c:c + g], c, st.kv, st.gdn)
    else:
        _, gdn = model(ids_tensor(st.ids[c:c + g], model.device), c, st.kv, st.gdn)
    st.gdn = gdn
    st.committed = c + g
    if st.committed in st.pending_lines:
        take_checkpoint(st, st.pending_lines.pop(st.committed), rcfg.max_checkpoints)


def take_checkpoint(st: SessionState, episode_start: bool, max_checkpoints: int) -> None:
    """Copy the GDN states at C into a checkpoint (none at 0: the zero state needs none)."""
    if st.committed == 0:
        return
    cp = Checkpoint(st.committed, clone_gdn(st.gdn), episode_start)
    st.checkpoints = checkpoints.add(st.checkpoints, cp, max_checkpoints)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
