"""Checkpoint keeping: which checkpoints stay, where a rewrite rolls back to, taking one.

Where a checkpoint belongs (the chat-aware lines: a turn's generation prompt, an episode's start)
is the reader's business (shadow_plugin.lines); it hands the lines down as positions
(SessionState.pending_lines). Keeping: the checkpoint at the start of the current episode
always stays; past `max_checkpoints` the oldest other one goes.
"""
from __future__ import annotations

from .layout import StateSpec, clone_gdn, zero_gdn
from .session import Checkpoint, SessionState


def first_difference(held: list[int], new: list[int]) -> int:
    """First position where the two differ; min(len) when one is a prefix of the other."""
    n = min(len(held), len(new))
    for i in range(n):
        if held[i] != new[i]:
            return i
    return n


def rollback_target(checkpoints: list[Checkpoint], d: int) -> Checkpoint | None:
    """The newest checkpoint at or below position d, or None (roll back to 0)."""
    best = None
    for cp in checkpoints:
        if cp.pos <= d and (best is None or cp.pos > best.pos):
            best = cp
    return best


def add(checkpoints: list[Checkpoint], cp: Checkpoint, max_checkpoints: int) -> list[Checkpoint]:
    """Insert `cp` (replacing one at the same line), clear the episode mark of the others when
    `cp` starts an episode, and drop the oldest non-episode checkpoints past the cap."""
    same = [c for c in checkpoints if c.pos == cp.pos]
    cp.episode_start = cp.episode_start or any(c.episode_start for c in same)
    kept = [c for c in checkpoints if c.pos != cp.pos]
    if cp.episode_start:
        for c in kept:
            c.episode_start = False
    kept = sorted(kept + [cp], key=lambda c: c.pos)
    while len(kept) > max_checkpoints:
        oldest = next(c for c in kept if not c.episode_start)
        kept.remove(oldest)
    return kept


def take(st: SessionState, episode_start: bool, max_checkpoints: int) -> None:
    """Copy the GDN states at C into a checkpoint (none at 0: the zero state needs none)."""
    if st.committed == 0:
        return
    cp = Checkpoint(st.committed, clone_gdn(st.gdn), episode_start)
    st.checkpoints = add(st.checkpoints, cp, max_checkpoints)


def rollback(st: SessionState, spec: StateSpec, d: int) -> None:
    """Move C back to the newest checkpoint at or below position d (0 without one), restoring
    its GDN states; checkpoints above d go. KV rows below the new C stay valid."""
    cp = rollback_target(st.checkpoints, d)
    st.committed = cp.pos if cp else 0
    st.gdn = clone_gdn(cp.gdn) if cp else zero_gdn(spec)
    st.checkpoints = [c for c in st.checkpoints if c.pos <= d]


def commit_chunk(st: SessionState, gdn, grid: int, max_checkpoints: int) -> None:
    """A chunk [C, C + grid) was read (its KV rows written, `gdn` the states after it): advance
    C, keep the states, and take the checkpoint due at the new C."""
    st.gdn = gdn
    st.committed += grid
    if st.committed in st.pending_lines:
        take(st, st.pending_lines.pop(st.committed), max_checkpoints)
