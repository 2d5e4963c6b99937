"""The reader's calls that run in a fork of a session: letter-choice questions (`ask`), greedy
decoding and summaries (`generate`, `summarize`), and re-reading below C in steps
(`prepare_fork`). A base class of reader.Reader, whose sessions, adapter and settling it uses
(`_get`, `_settle`, `adapter`, `config`, `_tokenizer`, `_scratch`); the work itself is in
fork.py.
"""
from __future__ import annotations

import dataclasses

from block_store import SessionState

from . import fork, questions, validate
from .tokenizer import load_tokenizer


class ForkCalls:
    """Questions, decoding and summaries on top of a session (mixed into reader.Reader)."""

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
            if not question.strip():
                raise ValueError("question must not be empty")
            prev = st.ids[at - 1] if at else None
            q_ids = questions.question_ids(self._tok(), question, choices, prev)
        else:
            q_ids = validate.token_ids(question, self.adapter.vocab_size, "question")
            if not q_ids:
                raise ValueError("question ids must not be empty")
        letters = questions.letter_ids(self._tok(), len(choices))
        answer = fork.answer(self.adapter, self.config, self.table.store, st, q_ids, letters,
                             choices, at, self._take_scratch(session, st, at))
        self._settle(session)
        return dataclasses.replace(answer, stale=st.stale) if st.stale else answer

    def prepare_fork(self, session: str, at: int, max_chunks: int = 1) -> int:
        """For a question or fork at `at` below C, which starts from a checkpoint and re-reads
        up to the grid line at or below `at` in scratch: read at most max_chunks (>= 1) of
        those chunks now, into a base kept for the session's next ask or generate at that line
        (one base a session, dropped when used, stale or the session is dropped; its pages
        are the session's own, found by key). Lets a server re-read a long way below C one
        chunk per hold of its lock. Returns the chunks read: 0 when the base is ready or
        `at` is at or above C. Raises KeyError for an unknown session, ValueError for a bad
        `at` or max_chunks."""
        st = self._get(session)
        at = validate.position(at, len(st.ids))
        if not isinstance(max_chunks, int) or isinstance(max_chunks, bool) or max_chunks < 1:
            raise ValueError(f"max_chunks must be an integer >= 1, got {max_chunks!r}")
        line = at // self.config.grid * self.config.grid
        if at >= st.committed:
            return 0
        # taken out first: a read that raises gives the base back, and none stays behind
        sc, done = fork.advance_scratch(self.adapter, self.config, self.table.store, st,
                                        session, line, self._scratch.pop(session, None),
                                        max_chunks)
        self._scratch[session] = sc
        self.adapter.sync()
        return done

    def _take_scratch(self, session: str, st: SessionState, at: int):
        """The session's prepared base for a fork at `at` (then taken: the fork gives it back),
        or None (at or above C, none prepared, or stale: given back now)."""
        sc = self._scratch.pop(session, None)
        line = at // self.config.grid * self.config.grid
        if at < st.committed and fork.scratch_valid(sc, session, st, line):
            return sc
        fork.drop_scratch(self.table.store, sc)
        return None

    def generate(self, session: str, prompt, max_new_tokens: int = 64, at: int | None = None,
                 stop_ids=questions.STOP_IDS) -> fork.Generation:
        """Greedy decoding in a fork on top of ids[:at] (default: all ids) and `prompt`: an
        instruction text (rendered as a user turn plus the generation prompt, thinking off) or
        ids already rendered. Stops after `max_new_tokens` or at a stop id (<|im_end|>,
        <|endoftext|>). Nothing at or below C changes. Returns fork.Generation.
        Raises KeyError for an unknown session, ValueError for bad input."""
        st = self._get(session)
        at = validate.position(at, len(st.ids))
        if validate.count(max_new_tokens, "max_new_tokens") == 0:
            raise ValueError("max_new_tokens must be >= 1")
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("prompt must not be empty")
            p_ids = questions.instruction_ids(self._tok(), prompt, st.ids[at - 1] if at else None)
        else:
            p_ids = validate.token_ids(prompt, self.adapter.vocab_size, "prompt")
            if not p_ids:
                raise ValueError("prompt ids must not be empty")
        out = fork.generate(self.adapter, self.config, self.table.store, st, p_ids, at,
                            max_new_tokens, set(stop_ids), self._take_scratch(session, st, at))
        self._settle(session)
        return dataclasses.replace(out, stale=st.stale) if st.stale else out

    def summarize(self, session: str, instruction: str = "Summarize this session in a few "
                  "sentences.", max_tokens: int = 128, at: int | None = None) -> tuple[str, fork.Generation]:
        """`generate` with an instruction; returns (text without the stop id, generation)."""
        gen = self.generate(session, instruction, max_tokens, at)
        ids = [i for i in gen.ids if i not in questions.STOP_IDS]
        return self._tok().decode(ids), gen
