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

import torch

from . import checkpoints
from .model.qwen35 import Qwen35
from .questions import Answer
from .state import SessionState, alloc_kv, clone_gdn, ensure_capacity, round_up, zero_gdn
from .step import ReaderConfig, ids_tensor, read_chunk, sync


def scratch_state(model: Qwen35, rcfg: ReaderConfig, st: SessionState, line: int,
                  extra_rows: int) -> tuple[SessionState, int]:
    """A scratch session at the newest checkpoint P <= line (or 0), with KV rows [0, P) copied
    and room for `extra_rows` rows; returns it and the number of ids it will read to reach line."""
    cp = checkpoints.rollback_target(st.checkpoints, line)
    p = cp.pos if cp else 0
    kv = alloc_kv(model.cfg, round_up(max(extra_rows, 1), rcfg.kv_step), model.device, model.dtype)
    for (nk, nv), (ok, ov) in zip(kv, st.kv):
        nk[:p], nv[:p] = ok[:p], ov[:p]
    gdn = clone_gdn(cp.gdn) if cp else zero_gdn(model.cfg, model.device, model.dtype)
    return SessionState(ids=st.ids[:line], committed=p, kv=kv, gdn=gdn), line - p


def answer(model: Qwen35, rcfg: ReaderConfig, st: SessionState, q_ids: list[int],
           letters: list[int], choices: list[str], at: int) -> Answer:
    """Answer a letter-choice question at `at` (validated by the caller). See the module doc.

    Returns an Answer whose probs are the softmax (fp32) over the letters' logits."""
    t0 = time.perf_counter()
    backlog = st.backlog
    line = at // rcfg.grid * rcfg.grid
    num_scratch = num_committed = 0
    if at >= st.committed:
        num_committed = line - st.committed           # whole chunks committed on the way
        while st.committed < line:
            read_chunk(model, rcfg, st)
        base = st
    else:
        base, num_scratch = scratch_state(model, rcfg, st, line, at + len(q_ids))
        while base.committed < line:
            read_chunk(model, rcfg, base)
    fwd = st.ids[line:at] + q_ids
    ensure_capacity(base, model.cfg, line + len(fwd), rcfg.kv_step)
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
