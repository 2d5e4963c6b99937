"""One session's memory: ids, committed length C, the pages holding KV rows [0, C) (shared
through the page store, kv_pool.KvPool), their keys, the GDN states at C, checkpoints (GDN
table entries at grid lines), and the pending tail of ids not yet read.

Layouts (block_store.memory.layout, asserted in `check_layout`):
- pages: page i holds KV rows [i G, (i + 1) G) of every attention layer, named by keys[i]
  (keys.page_keys: the chain over ids[:(i + 1) G]); pages are never written once named, so
  sessions share them;
- GDN state per linear layer: conv [conv_dim, W] and recurrent [HV, K, V] fp32, after token C;
- checkpoint: a GDN table entry at a grid line P <= C (KV rows need none: pages below P stay).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from block_store.memory.gdn_table import GdnEntry
from block_store.memory.kv_pool import PagedKv
from block_store.memory.layout import RECURRENT_LAYOUT, GdnState, StateSpec, clone_gdn, zero_gdn
from block_store.memory.pool import Page
from block_store.pages import PageStore


@dataclass
class Checkpoint:
    """The GDN entry at grid line `pos`; episode_start marks the checkpoint at the start of
    the current episode and `kept` the one at the shared prefix's line (neither is dropped
    past the session's cap)."""

    pos: int
    entry: GdnEntry
    episode_start: bool = False
    kept: bool = False

    @property
    def gdn(self) -> GdnState:
        return self.entry.states


@dataclass
class SessionState:
    """Everything held for one session.

    ids: the session's ids as the host served and produced them; committed: C, a multiple of
    the grid; pages, keys: the pages of KV rows [0, C) and their keys (one per page); gdn: the
    states at C; pending_lines: grid line above C where a checkpoint is due (handed down by
    the reader) -> whether it starts an episode; shared_line: the line at or below the end of
    the first system message (what one agent's sessions share; 0: none), kept; junction: the
    line where the prompt's held pages (another session's chain) ended without a state: an
    unreferenced entry is kept there for the next session with that prefix; tip: GDN entries
    at the last lines committed near
    the end of the ids (a rewrite where the host's output meets the next prompt resumes a
    page below); furthest: the furthest C committed (re-reads are counted below it, under
    reread_cause: the cause of the last rewrite that sent C back); counted: whether its reads
    count as reads into committed state (not a fork's scratch base);
    last_used: the table's LRU clock; unsaved_outputs: outputs were appended since its manifest
    was last written (that manifest says it is stale); stale: restored from a stale manifest,
    so it holds a prefix of what the host sent until the host's next prompt; manifest_mark:
    (writer, seq) of the manifest version this process last wrote or restored (None: none),
    which its next manifest write must find on disk (DiskStore.write_manifest).
    """

    ids: list[int]
    committed: int
    pages: list[Page]
    keys: list[bytes]
    gdn: GdnState
    checkpoints: list[Checkpoint] = field(default_factory=list)
    pending_lines: dict[int, bool] = field(default_factory=dict)
    shared_line: int = 0
    junction: int = 0
    tip: list[GdnEntry] = field(default_factory=list)
    furthest: int = 0
    reread_cause: str = "other"
    counted: bool = True
    last_used: int = 0
    unsaved_outputs: bool = False
    stale: bool = False
    manifest_mark: tuple[str, int] | None = None

    @property
    def backlog(self) -> int:
        return len(self.ids) - self.committed


def new_state(spec: StateSpec) -> SessionState:
    """An empty session: no ids, C = 0, zero GDN states, no pages."""
    return SessionState(ids=[], committed=0, pages=[], keys=[], gdn=zero_gdn(spec))


def release_state(store: PageStore, st: SessionState) -> None:
    """Give back every page and GDN entry the state references (they stay cached, findable
    by key, until reused or evicted) and empty it (no ids, C = 0)."""
    store.release_pages(st.pages)
    for e in [cp.entry for cp in st.checkpoints] + st.tip:
        store.gdn.release(e)
    st.pages, st.keys, st.checkpoints, st.tip = [], [], [], []
    st.ids, st.committed = [], 0             # a state given back can pass for no other


def kv_view(store: PageStore, st: SessionState) -> PagedKv:
    """The session's committed KV rows [0, C) as a PagedKv."""
    return store.view(st.pages)


def scratch_from(store: PageStore, st: SessionState, cp: Checkpoint | None,
                 line: int) -> SessionState:
    """A scratch session at checkpoint `cp` (or 0 without one) holding ids[:line], sharing
    the session's pages below cp.pos (referenced: give them back with release_state); the
    session itself is not changed."""
    p = cp.pos if cp else 0
    n = p // store.grid
    gdn = clone_gdn(cp.gdn) if cp else zero_gdn(store.spec)
    return SessionState(ids=st.ids[:line], committed=p, pages=store.take_pages(st.pages[:n]),
                        keys=list(st.keys[:n]), gdn=gdn, counted=False)


def fork_pages(store: PageStore, st: SessionState, rows: int) -> tuple[PagedKv, list[Page]]:
    """KV for a fork writing rows [C, rows) above the session's committed pages: (the view,
    the scratch pages to give back with store.release_pages after the fork)."""
    need = max(0, -(-rows // store.grid) - len(st.pages))
    scratch = [store.allocate() for _ in range(need)]
    return store.view(st.pages, scratch), scratch


def check_layout(state: SessionState, spec: StateSpec, grid: int) -> None:
    """Assert the layouts named in this module's docstring (shapes, dtypes, one named page a
    grid line below C)."""
    for conv, rec in state.gdn:
        assert tuple(conv.shape) == (spec.conv_dim, spec.conv_width), conv.shape
        assert tuple(rec.shape) == spec.recurrent_shape and rec.dtype == torch.float32, \
            RECURRENT_LAYOUT
    assert len(state.pages) == len(state.keys) == state.committed // grid
    assert all(p.key == k and p.refs > 0 for p, k in zip(state.pages, state.keys))


def state_bytes(state: SessionState, page_bytes: int) -> int:
    """Bytes the session references: its pages (shared ones counted in full), its GDN
    states, its checkpoints' and tip entries (an entry both a checkpoint and in the tip ring
    once)."""
    gdn = sum(c.nbytes + r.nbytes for c, r in state.gdn)
    held = {id(e): e for e in [cp.entry for cp in state.checkpoints] + state.tip}
    entries = sum(e.nbytes for e in held.values())
    return len(state.pages) * page_bytes + gdn + entries
