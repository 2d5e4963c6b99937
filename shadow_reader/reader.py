"""The reader: sessions fed turn by turn, read in whole grid chunks, rolled back on rewrites,
asked letter-choice questions in one forward.

Contract (DESIGN.md): after any history of feeds, reads and asks, a session's committed state
equals a fresh prefill of ids[:C] on the same grid, bit for bit (`check_exact`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from . import checkpoints, exact, fork, questions, validate
from .model.qwen35 import Qwen35
from .state import SessionState, check_layout, clone_gdn, new_state, state_bytes, zero_gdn
from .step import ReaderConfig, read_chunk, sync, take_checkpoint
from .tokenizer import load_tokenizer


@dataclass(frozen=True)
class FeedResult:
    """first_difference: first position where a prompt differed from the held ids (None for
    output); rolled_back_from / rolled_back_to: C before and after a rollback (None when there
    was none); backlog: len(ids) - C after the feed; episode_start: the prompt ends a real user
    message."""

    first_difference: int | None
    rolled_back_from: int | None
    rolled_back_to: int | None
    backlog: int
    episode_start: bool = False


@dataclass(frozen=True)
class ReadResult:
    """num_read_tokens: ids committed (num_chunks x G); ms: wall time including a device sync."""

    num_read_tokens: int
    num_chunks: int
    ms: float


class Reader:
    """Exact incremental reader over one model.

    Args: model (shadow_reader.model.Qwen35); grid (G, a multiple of 64); kv_step (KV growth in
    rows); max_checkpoints; tokenizer (an object with encode(text) -> ids; default:
    shadow_reader.tokenizer.load_tokenizer(), loaded on the first text question).
    Raises ValueError for a bad grid, kv_step or max_checkpoints.
    """

    def __init__(self, model: Qwen35, grid: int = 512, kv_step: int = 8192,
                 max_checkpoints: int = 6, tokenizer=None):
        self.model = model
        self.config = ReaderConfig(grid, kv_step, max_checkpoints)
        self._tokenizer = tokenizer
        self._sessions: dict[str, SessionState] = {}
        self._clock = 0

    # -- sessions -------------------------------------------------------------------------------
    def _get(self, session) -> SessionState:
        validate.session_id(session)
        st = self._sessions.get(session)
        if st is None:
            raise KeyError(f"unknown session {session!r}")
        self._clock += 1
        st.last_used = self._clock
        return st

    def sessions(self) -> list[str]:
        """Session ids, most recently used first."""
        return sorted(self._sessions, key=lambda s: -self._sessions[s].last_used)

    def drop(self, session: str) -> None:
        """Forget a session and free its tensors. Raises KeyError for an unknown session."""
        self._get(session)
        del self._sessions[session]

    def committed(self, session: str) -> int:
        return self._get(session).committed

    def backlog(self, session: str) -> int:
        return self._get(session).backlog

    def ids(self, session: str) -> list[int]:
        return list(self._get(session).ids)

    def checkpoint_positions(self, session: str) -> list[int]:
        return [cp.pos for cp in self._get(session).checkpoints]

    def state_bytes(self, session: str) -> int:
        return state_bytes(self._get(session))

    # -- feeding --------------------------------------------------------------------------------
    def feed(self, session: str, ids, kind: str, episode_start: bool | None = None) -> FeedResult:
        """Give the reader a new turn's whole prompt (`kind="prompt"`) or ids the host produced
        (`kind="output"`, appended). A prompt that differs from the held ids at position d rolls
        back to the newest checkpoint at or below d (KV rows below stay), or to 0 without one.
        `episode_start` says whether the prompt ends a real user message (default: read from
        the ids). A prompt for an unknown session creates it.

        Raises ValueError for bad ids, kind or session id (nothing changes), KeyError for output
        to an unknown session.
        """
        validate.session_id(session)
        if kind not in ("prompt", "output"):
            raise ValueError(f"kind must be 'prompt' or 'output', got {kind!r}")
        new = validate.token_ids(ids, self.model.cfg.vocab_size)
        if kind == "output":
            st = self._get(session)
            st.ids.extend(new)
            return FeedResult(None, None, None, st.backlog)
        if not new:
            raise ValueError("a prompt must hold at least one id")
        if session not in self._sessions:
            self._sessions[session] = new_state(self.model.cfg, self.model.device, self.model.dtype)
        st = self._get(session)
        return self._feed_prompt(st, new, episode_start)

    def _feed_prompt(self, st: SessionState, prompt: list[int], episode: bool | None) -> FeedResult:
        grid = self.config.grid
        d = checkpoints.first_difference(st.ids, prompt)
        before = st.committed
        rolled = d < st.committed
        if rolled:
            cp = checkpoints.rollback_target(st.checkpoints, d)
            st.committed = cp.pos if cp else 0
            st.gdn = clone_gdn(cp.gdn) if cp else zero_gdn(self.model.cfg, self.model.device,
                                                          self.model.dtype)
            st.checkpoints = [c for c in st.checkpoints if c.pos <= d]
        st.ids = prompt
        st.pending_lines = {p: e for p, e in st.pending_lines.items() if st.committed < p <= d}
        episode = checkpoints.is_episode_start(prompt) if episode is None else bool(episode)
        line = checkpoints.prompt_line(prompt, grid)
        if line == st.committed:
            take_checkpoint(st, episode, self.config.max_checkpoints)
        elif line > st.committed:
            st.pending_lines[line] = episode or st.pending_lines.get(line, False)
        return FeedResult(d, before if rolled else None, st.committed if rolled else None,
                          st.backlog, episode)

    # -- reading --------------------------------------------------------------------------------
    def read(self, session: str | None = None, max_chunks: int | None = None) -> ReadResult:
        """Advance whole chunks only: the given session, or every session with a backlog of a
        chunk or more, most recently used first; at most `max_chunks` chunks in all."""
        if max_chunks is not None and max_chunks < 0:
            raise ValueError(f"max_chunks must be >= 0, got {max_chunks}")
        names = [session] if session is not None else self.sessions()
        states = [self._get(s) for s in names]
        t0, n = time.perf_counter(), 0
        for st in states:
            while st.backlog >= self.config.grid and (max_chunks is None or n < max_chunks):
                read_chunk(self.model, self.config, st)
                n += 1
        sync(self.model.device)
        return ReadResult(n * self.config.grid, n, (time.perf_counter() - t0) * 1e3)

    # -- questions ------------------------------------------------------------------------------
    def _tok(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer()
        return self._tokenizer

    def ask(self, session: str, question, choices, at: int | None = None) -> questions.Answer:
        """Ask a letter-choice question about ids[:at] (default: all ids) in one forward.

        `question` is text (rendered as a user turn, questions.question_text) or a list of ids
        already rendered. Returns questions.Answer. Raises KeyError for an unknown session,
        ValueError for fewer than 2 or more than 26 choices, `at` beyond the ids, or bad ids.
        """
        st = self._get(session)
        choices = validate.choices(choices)
        at = validate.position(at, len(st.ids))
        if isinstance(question, str):
            prev = st.ids[at - 1] if at else None
            q_ids = questions.question_ids(self._tok(), question, choices, prev)
        else:
            q_ids = validate.token_ids(question, self.model.cfg.vocab_size, "question")
            if not q_ids:
                raise ValueError("question ids must not be empty")
        letters = questions.letter_ids(self._tok(), len(choices))
        return fork.answer(self.model, self.config, st, q_ids, letters, choices, at)

    # -- exactness ------------------------------------------------------------------------------
    def state_tensors(self, session: str) -> dict[str, torch.Tensor]:
        """name -> tensor of the committed state (exact.state_names): KV rows [0, C) and the
        GDN states after token C. Views, not copies: clone before changing the session."""
        st = self._get(session)
        check_layout(st, self.model.cfg)
        return exact.pack(self.model, st.kv, st.gdn, st.committed)

    def check_exact(self, session: str) -> bool:
        """Compare the committed state with a fresh prefill of ids[:C] on the same grid (run by
        exact.fresh_prefill's own loop). Returns True; raises exact.ExactnessError naming the
        first differing tensor and index."""
        st = self._get(session)
        want = exact.fresh_prefill(self.model, st.ids[:st.committed], self.config.grid)
        exact.compare(self.state_tensors(session), want)
        return True
