"""Forks: work on top of a session's state that leaves everything at or below C as it was.

A question's answer depends only on ids[:at] and the question (docs/design.md, "The contract"): the
forward always starts from the state at L = the grid line at or below `at`:
- at >= C: the reader first commits whole chunks up to L (so C == L), then forwards ids[L:at] and
  the question above C, into scratch pages from the pool (given back after), and drops the GDN
  states it returns;
- at < C: a scratch state starts from the newest checkpoint at or below L (or from 0) sharing
  the session's pages below it, reads forward to L (its pages are the session's own, found by
  key), and forwards the rest there; the session never sees it.
Both paths give the same bits: the same ids on the same grid from equal states.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from adapters import Adapter
from block_store import PageStore, SessionState
from block_store.checkpoints import rollback_target
from block_store.session import fork_pages, release_state, scratch_from
from shadow_plugin.chat.questions import Answer
from shadow_plugin.reader.step import ReaderConfig, read_chunk


@dataclass
class Scratch:
    """A scratch base read toward grid line `line` of `session` over several calls (so a long
    re-read below C need not hold the reader for its whole length): state (its pages
    referenced: give them back with `drop_scratch`) and the ids it reads in all (num_scratch).
    Valid while the session's ids below `line` equal state.ids."""

    session: str
    line: int
    state: SessionState
    num_scratch: int


def new_scratch(store: PageStore, st: SessionState, session: str, line: int) -> Scratch:
    """A base at the newest checkpoint at or below `line` (or 0)."""
    base = scratch_from(store, st, rollback_target(st.checkpoints, line), line)
    return Scratch(session, line, base, line - base.committed)


def drop_scratch(store: PageStore, sc: Scratch | None) -> None:
    if sc is not None:
        release_state(store, sc.state)


def scratch_valid(sc: Scratch | None, session: str, st: SessionState, line: int) -> bool:
    """Whether sc is a base toward `line` of this session whose ids still equal the session's
    below the line (then its pages and states do too)."""
    return sc is not None and sc.session == session and sc.line == line \
        and sc.state.ids == st.ids[:line]


def advance_scratch(adapter: Adapter, rcfg: ReaderConfig, store: PageStore, st: SessionState,
                    session: str, line: int, sc: Scratch | None,
                    max_chunks: int) -> tuple[Scratch, int]:
    """Read at most max_chunks chunks of the scratch base toward `line` (< C), starting one
    at the newest checkpoint when sc is not valid for it (an invalid one is given back).
    Returns (the base, chunks read)."""
    if not scratch_valid(sc, session, st, line):
        drop_scratch(store, sc)
        sc = new_scratch(store, st, session, line)
    done = 0
    try:
        while sc.state.committed < line and done < max_chunks:
            read_chunk(adapter, rcfg, store, sc.state)
            done += 1
    except BaseException:                  # a failed read: the base goes, its pages back
        drop_scratch(store, sc)
        raise
    return sc, done


def fork_base(adapter: Adapter, rcfg: ReaderConfig, store: PageStore, st: SessionState,
              at: int, scratch: Scratch | None = None) -> tuple[Scratch | None, int, int, int]:
    """Bring a fork's base to the grid line L at or below `at` (see the module doc); whole
    chunks go through the adapter's chunk forward (so they give the bits reads give).
    Returns (the scratch base below C, or None when the base is the session itself; L; ids
    committed on the way; ids read in scratch). scratch: a base already (partly) read toward
    L below C, checked valid by the caller. The caller gives the scratch base back (when a
    read raises, it is given back here)."""
    line = at // rcfg.grid * rcfg.grid
    if at >= st.committed:
        num_committed = line - st.committed
        while st.committed < line:
            read_chunk(adapter, rcfg, store, st)
        return None, line, num_committed, 0
    sc = scratch if scratch is not None else new_scratch(store, st, "", line)
    try:
        while sc.state.committed < line:
            read_chunk(adapter, rcfg, store, sc.state)
    except BaseException:                  # a failed read: the base goes, its pages back
        drop_scratch(store, sc)
        raise
    return sc, line, 0, sc.num_scratch


def answer(adapter: Adapter, rcfg: ReaderConfig, store: PageStore, st: SessionState,
           q_ids: list[int], letters: list[int], choices: list[str], at: int,
           scratch: Scratch | None = None) -> Answer:
    """Answer a letter-choice question at `at` (validated by the caller). See the module doc.
    The tail and question go through adapter.fork_logits (one forward).

    Returns an Answer whose probs are the softmax (fp32) over the letters' logits."""
    t0 = time.perf_counter()
    backlog = st.backlog
    line = at // rcfg.grid * rcfg.grid
    fwd = st.ids[line:at] + q_ids
    sc, line, num_committed, num_scratch = fork_base(adapter, rcfg, store, st, at, scratch)
    base = sc.state if sc else st
    try:
        kv, pages = fork_pages(store, base, line + adapter.fork_rows(len(fwd)))
        try:
            logits = adapter.fork_logits(fwd, line, kv, base.gdn, letters)
            probs = torch.softmax(logits, dim=-1).tolist()
            adapter.sync()
        finally:
            store.release_pages(pages)
    finally:
        drop_scratch(store, sc)
    best = max(range(len(probs)), key=probs.__getitem__)
    return Answer(label=choices[best], letter=chr(65 + best), probs=tuple(probs),
                  ms=(time.perf_counter() - t0) * 1e3,
                  num_forwarded_tokens=num_committed + num_scratch + len(fwd),
                  num_committed=num_committed, backlog=backlog, at=at,
                  beyond_max_positions=line + len(fwd) > adapter.max_positions)


@dataclass(frozen=True)
class Generation:
    """ids: the greedy continuation (ending with a stop id when one came); prefill_ms: the fork's
    first forward (tail and prompt, after any chunks it had to read); ms_per_token: mean wall
    time of the one-token decode steps (those the decode loop ran past a stop id it saw late
    included); num_forwarded_tokens: as Answer's; at: the position; stale: as Answer's (the
    session holds a prefix of what the host sent, Reader.stale)."""

    ids: tuple[int, ...]
    prefill_ms: float
    ms_per_token: float
    num_forwarded_tokens: int
    at: int
    stale: bool = False


def generate(adapter: Adapter, rcfg: ReaderConfig, store: PageStore, st: SessionState,
             prompt_ids: list[int], at: int, max_new_tokens: int, stop_ids: set[int],
             scratch: Scratch | None = None) -> Generation:
    """Greedy decoding on top of ids[:at] + prompt_ids in a fork (adapter.decode): KV rows
    above C go to scratch pages, the GDN states it produces are dropped. Depends only on
    ids[:at] and the prompt."""
    t0 = time.perf_counter()
    sc, line, num_committed, num_scratch = fork_base(adapter, rcfg, store, st, at, scratch)
    base = sc.state if sc else st
    fwd = st.ids[line:at] + prompt_ids
    try:
        kv, pages = fork_pages(store, base, at + len(prompt_ids) + max_new_tokens)
        try:
            t_base = time.perf_counter()
            out = adapter.decode(fwd, line, kv, base.gdn, max_new_tokens, stop_ids)
        finally:
            store.release_pages(pages)
    finally:
        drop_scratch(store, sc)
    return Generation(out.ids, (t_base - t0) * 1e3 + out.prefill_ms,
                      out.decode_ms / out.num_steps if out.num_steps else 0.0,
                      num_committed + num_scratch + len(fwd) + out.num_steps, at)
