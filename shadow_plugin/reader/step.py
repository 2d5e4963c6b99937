"""The reader's unit of work on one session: read one grid chunk into a page and commit it.

Functions over (adapter, config, page store, state) passed as arguments; the reader and forks
share them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from adapters import Adapter
from block_store import PageStore, SessionState
from block_store.checkpoints import commit_chunk, commit_held, held_chunk


@dataclass(frozen=True)
class ReaderConfig:
    """grid: G, the chunk length, the page's rows and the only lines C stops at (a multiple of
    64, so fla's 64-token chunks line up on CUDA, docs/specs/qwen35.md section 9.2);
    max_checkpoints: checkpoints kept per session (>= 1; the episode start's and the shared
    prefix's are kept beside them)."""

    grid: int = 512
    max_checkpoints: int = 6

    def __post_init__(self) -> None:
        if self.grid < 64 or self.grid % 64:
            raise ValueError(f"grid must be a positive multiple of 64, got {self.grid}")
        if self.max_checkpoints < 1:
            raise ValueError(f"max_checkpoints must be >= 1, got {self.max_checkpoints}")


def read_chunk(adapter: Adapter, rcfg: ReaderConfig, store: PageStore,
               st: SessionState) -> float:
    """Advance C by one grid chunk: when the pool holds the chunk's page and the GDN table the
    states at its end (another session, or this one before a rewrite, read it), take them
    without a forward; else forward ids[C:C+G] at C into a new page, commit the GDN states,
    name the page (or take the one already holding its content). Take the checkpoints due at
    the new C. Requires a backlog of at least G. C, the pages and the GDN
    states change only after the forward returned; a forward that raises gives its page
    back. Returns the host's time in the forward's call (ms, time.perf_counter: its launches
    and any wait for the device inside it; 0.0 without a forward)."""
    c, g = st.committed, rcfg.grid
    assert st.backlog >= g, "read_chunk needs a whole chunk of backlog"
    key, held, entry = held_chunk(store, st)
    if held is not None:                  # its page and end states are held: no forward
        commit_held(store, st, key, held, entry, rcfg.max_checkpoints)
        return 0.0
    page = store.allocate()
    try:
        t0 = time.perf_counter()
        gdn = adapter.read_chunk(st.ids[c:c + g], c, store.view(st.pages, [page]), st.gdn)
        forward_ms = (time.perf_counter() - t0) * 1e3
    except BaseException:
        store.manager.release(page)
        raise
    commit_chunk(store, st, page, gdn, rcfg.max_checkpoints, key)
    return forward_ms


def read_chunks(adapter: Adapter, rcfg: ReaderConfig, store: PageStore,
                states: list[SessionState]) -> tuple[list[SessionState], float]:
    """Advance C by one grid chunk in each of several sessions (each a backlog of at least G)
    with one forward for those that need one (adapter.read_chunks), each committed exactly as
    read_chunk commits it alone: a chunk whose page and end states are held is taken without a
    forward; a chunk with the same key as another's in this call is left for the next call
    (it is held then); the rest go into new pages, forwarded together, committed in order.
    Returns the states that advanced and the host's time in the forward's call (ms, as
    read_chunk's). Nothing changes when the forward raises (the new pages are given back)."""
    g, todo, keys, done = rcfg.grid, [], set(), []
    for st in states:
        assert st.backlog >= g, "read_chunks needs a whole chunk of backlog in each"
        key, held, entry = held_chunk(store, st)
        if held is not None:
            commit_held(store, st, key, held, entry, rcfg.max_checkpoints)
            done.append(st)
        elif key not in keys:
            keys.add(key)
            todo.append((st, key))
    pages = []
    try:
        for _ in todo:
            pages.append(store.allocate())
        items = [(st.ids[st.committed:st.committed + g], st.committed,
                  store.view(st.pages, [page]), st.gdn) for (st, _), page in zip(todo, pages)]
        t0 = time.perf_counter()
        states_after = adapter.read_chunks(items) if items else []
        forward_ms = (time.perf_counter() - t0) * 1e3 if items else 0.0
    except BaseException:
        for page in pages:
            store.manager.release(page)
        raise
    for (st, key), page, gdn in zip(todo, pages, states_after):
        commit_chunk(store, st, page, gdn, rcfg.max_checkpoints, key)
        done.append(st)
    return done, forward_ms
