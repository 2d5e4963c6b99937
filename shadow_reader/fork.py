"""Forks: work on top of a session's state that leaves everything at or below C as it was.

A question's answer depends only on ids[:at] and the question (DESIGN.md, "The contract"): the
forward always starts from the state at L = the grid line at or below `at`:
- at >= C: the reader first commits whole chunks up to L (so C == L), then forwards ids[L:at] and
  the question above C, into KV rows that are scratch, and drops the GDN states it returns;
- at < C: a scratch state starts from the newest checkpoint at or below L (or from 0) with a copy
  of KV rows [0, P), reads forward to L, and forwards the rest there; the session never sees it.
Both paths give the same bits: the same ids on the same grid from equal states.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from . import checkpoints
from .model.qwen35 import Qwen35
from .questions import Answer
from .state import (SessionState, alloc_kv, clone_gdn, copy_rows, ensure_capacity, round_up,
                    zero_gdn)
from .step import ReaderConfig, ids_tensor, read_chunk, sync


def scratch_state(model: Qwen35, rcfg: ReaderConfig, st: SessionState, line: int,
                  rows: int) -> tuple[SessionState, int]:
    """A scratch session at the newest checkpoint P <= line (or 0), with KV rows [0, P) copied
    and room for `rows` rows; returns it and the number of ids it will read to reach line."""
    cp = checkpoints.rollback_target(st.checkpoints, line)
    p = cp.pos if cp else 0
    kv = alloc_kv(model.cfg, round_up(max(rows, 1), rcfg.kv_step), model.device, model.dtype)
    copy_rows(kv, st.kv, p)
    gdn = clone_gdn(cp.gdn) if cp else zero_gdn(model.cfg, model.device, model.dtype)
    return SessionState(ids=st.ids[:line], committed=p, kv=kv, gdn=gdn), line - p


@dataclass
class Scratch:
    """A scratch base read toward grid line `line` of `session` over several calls (so a long
    re-read below C need not hold the reader for its whole length): state and the ids it reads
    in all (num_scratch). Valid while the session's ids below `line` equal state.ids."""

    session: str
    line: int
    state: SessionState
    num_scratch: int


def scratch_valid(sc: Scratch | None, session: str, st: SessionState, line: int) -> bool:
    """Whether sc is a base toward `line` of this session whose ids still equal the session's
    below the line (then its KV rows and states do too)."""
    return sc is not None and sc.session == session and sc.line == line \
        and sc.state.ids == st.ids[:line]


def advance_scratch(model: Qwen35, rcfg: ReaderConfig, st: SessionState, session: str,
                    line: int, sc: Scratch | None, max_chunks: int,
                    graphs=None) -> tuple[Scratch, int]:
    """Read at most max_chunks chunks of the scratch base toward `line` (< C), starting one
    at the newest checkpoint when sc is not valid for it. Returns (the base, chunks read)."""
    if not scratch_valid(sc, session, st, line):   # room for the tail and a question bucket
        sc = Scratch(session, line, *scratch_state(model, rcfg, st, line, line + 4096))
    done = 0
    while sc.state.committed < line and done < max_chunks:
        read_chunk(model, rcfg, sc.state, graphs)
        done += 1
    return sc, done


def fork_base(model: Qwen35, rcfg: ReaderConfig, st: SessionState, at: int,
              rows: int, graphs=None, scratch: Scratch | None = None
              ) -> tuple[SessionState, int, int, int]:
    """The state a fork starts from: at the grid line L at or below `at` (see the module doc),
    with KV room for `rows` rows; whole chunks go through `graphs` (the reader's chunk runner,
    so they give the bits its reads give). Returns (state, L, ids committed on the way, ids read in
    scratch); the state is the session's own when at >= C (use only rows above C). scratch: a
    base already (partly) read toward L below C, checked valid by the caller."""
    line = at // rcfg.grid * rcfg.grid
    if at >= st.committed:
        num_committed = line - st.committed
        while st.committed < line:
            read_chunk(model, rcfg, st, graphs)
        ensure_capacity(st, model.cfg, rows, rcfg.kv_step)
        return st, line, num_committed, 0
    if scratch is not None:
        base, num_scratch = scratch.state, scratch.num_scratch
        ensure_capacity(base, model.cfg, rows, rcfg.kv_step)
    else:
        base, num_scratch = scratch_state(model, rcfg, st, line, rows)
    while base.committed < line:
        read_chunk(model, rcfg, base, graphs)
    return base, line, 0, num_scratch


def answer(model: Qwen35, rcfg: ReaderConfig, st: SessionState, q_ids: list[int],
           letters: list[int], choices: list[str], at: int, graphs=None,
           scratch: Scratch | None = None) -> Answer:
    """Answer a letter-choice question at `at` (validated by the caller). See the module doc.
    With `graphs` (model.runners.Runners) the tail and question go through the runner of their
    length bucket, else the eager forward.

    Returns an Answer whose probs are the softmax (fp32) over the letters' logits."""
    t0 = time.perf_counter()
    backlog = st.backlog
    line = at // rcfg.grid * rcfg.grid
    fwd = st.ids[line:at] + q_ids
    runner = graphs.for_rows(len(fwd)) if graphs is not None else None
    rows = max(at + len(q_ids), line + (runner.t if runner else 0))
    base, line, num_committed, num_scratch = fork_base(model, rcfg, st, at, rows, graphs,
                                                       scratch)
    if runner is not None:      # padded after the real rows, into scratch KV rows above line
        padded = torch.tensor(fwd + [fwd[-1]] * (runner.t - len(fwd)), dtype=torch.long)
        hidden, _ = runner.run(padded, line, base.kv, base.gdn)
        hidden = hidden[len(fwd) - 1:len(fwd)]
    else:
        hidden, _ = model(ids_tensor(fwd, model.device), line, base.kv, base.gdn)
    logits = model.logits(hidden[-1:], ids_tensor(letters, model.device))[0].float()
    probs = torch.softmax(logits, dim=-1).tolist()
    sync(model.device)
    best = max(range(len(probs)), key=probs.__getitem__)
    return Answer(label=choices[best], letter=chr(65 + best), probs=tuple(probs),
                  ms=(time.perf_counter() - t0) * 1e3,
                  num_forwarded_tokens=num_committed + num_scratch + len(fwd),
                  num_committed=num_committed, backlog=backlog, at=at,
                  beyond_max_positions=line + len(fwd) > model.cfg.max_position_embeddings)


@dataclass(frozen=True)
class Generation:
    """ids: the greedy continuation (ending with a stop id when one came); prefill_ms: the fork's
    first forward (tail and prompt, after any chunks it had to read); ms_per_token: mean wall
    time of the one-token decode steps (those the decode loop ran past a stop id it saw late
    included); num_forwarded_tokens: as Answer's; at: the position."""

    ids: tuple[int, ...]
    prefill_ms: float
    ms_per_token: float
    num_forwarded_tokens: int
    at: int


def generate(model: Qwen35, rcfg: ReaderConfig, st: SessionState, prompt_ids: list[int],
             at: int, max_new_tokens: int, stop_ids: set[int], graphs=None,
             scratch: Scratch | None = None) -> Generation:
    """Greedy decoding on top of ids[:at] + prompt_ids in a fork: KV rows above C are scratch,
    the GDN states it produces are dropped. Depends only on ids[:at] and the prompt. The first
    forward is eager (its GDN states must end at the last real id); with `graphs`
    (model.runners.Runners) the decode steps go through its decode loop (the single-token
    runner, each token fed back on the device: model.decode)."""
    t0 = time.perf_counter()
    rows = at + len(prompt_ids) + max_new_tokens
    base, line, num_committed, num_scratch = fork_base(model, rcfg, st, at, rows, graphs,
                                                       scratch)
    fwd = st.ids[line:at] + prompt_ids
    hidden, gdn = model(ids_tensor(fwd, model.device), line, base.kv, base.gdn)
    token = int(model.logits(hidden[-1:])[0].argmax())
    t1 = time.perf_counter()
    out, pos, steps = [token], line + len(fwd), 0      # steps: one-token forwards run
    if graphs is not None and max_new_tokens > 1 and token not in stop_ids:
        new, steps = graphs.decode_loop().run(token, pos, base.kv, gdn, max_new_tokens - 1,
                                              stop_ids)
        out += new
    while len(out) < max_new_tokens and out[-1] not in stop_ids:      # without runners
        hidden, gdn = model(ids_tensor([out[-1]], model.device), pos, base.kv, gdn)
        out.append(int(model.logits(hidden)[0].argmax()))
        pos += 1
        steps += 1
    sync(model.device)
    return Generation(tuple(out), (t1 - t0) * 1e3,
                      (time.perf_counter() - t1) * 1e3 / steps if steps else 0.0,
                      num_committed + num_scratch + len(fwd) + steps, at)
