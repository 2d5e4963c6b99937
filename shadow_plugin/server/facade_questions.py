"""The facade's question calls (mixed into facade.Shadow): where a question forks, the
positions a waiting ask looks at, the catch-up reading a question needs (bounded, chunk by
chunk, stopped when its client has gone), the ask, the summary and the exactness check. Every
call takes the one lock (or the gate, for the heavy work) itself.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import xxhash

from block_store import ExactnessError

from .errors import CatchUpTooLong, ClientGone


def ids_digest(ids) -> str:
    """xxh3-64 hex of the ids as int64 little-endian bytes."""
    return xxhash.xxh3_64(np.asarray(ids, dtype="<i8").tobytes()).hexdigest()


def _check_cancel(cancelled: threading.Event | None) -> None:
    if cancelled is not None and cancelled.is_set():
        raise ClientGone()


class QuestionCalls:
    """Questions over the reader (needs `reader`, `grid`, `lock`, `gate`, `_position`,
    `max_catchup_tokens`, `ask_ms`, `answers`, `last_answer`, `host` from facade.Shadow)."""

    def fork_position(self, session: str, at: int | None) -> int:
        """The position a question or summary forks at: `at`, or all the session's ids. KeyError
        (404) for an unknown session, ValueError (400) for an `at` past its ids."""
        with self.lock:
            n = self._position(session)[0]
        if at is not None and at > n:
            raise ValueError(f"at = {at} is outside the session's ids [0, {n}]")
        return n if at is None else at

    def position(self, session: str) -> tuple[int, int]:
        """(ids held, C) under the lock, restoring nothing; KeyError for an unknown session."""
        with self.lock:
            return self._position(session)

    def positions(self, sessions: list[str]) -> dict[str, list[int] | None]:
        """{session: [ids held, C], or None when unknown} in one hold of the lock (what the
        waiting asks look at, server.waits.Waits)."""
        out: dict[str, list[int] | None] = {}
        with self.lock:
            for s in sessions:
                try:
                    out[s] = list(self._position(s))
                except (KeyError, ValueError):
                    out[s] = None
        return out

    def not_reading_why(self) -> str:
        """Why the idle window is not reading (for a 504): the open turns, the busy flag."""
        with self.lock:
            turns = sorted(self.host.scheduler.turns)
            busy = self.host.scheduler.host_busy()
        if turns:
            more = f" and {len(turns) - 5} more" if len(turns) > 5 else ""
            return (f"the idle window waits for open turns to end (POST .../end): "
                    f"{', '.join(turns[:5])}{more}")
        if busy:
            return "the host reports busy (POST /v1/shadow/host {\"busy\": false} to free it)"
        return "the reader is reading other sessions or the backlog is large"

    def catch_up_tokens(self, session: str, at: int) -> int:
        """Ids a question at `at` must read first: up to the grid line at or below `at`, from
        C (at or above it) or from the newest checkpoint at or below `at` (below C). KeyError
        for an unknown session."""
        with self.lock:
            n, c = self._position(session)
            line = at // self.grid * self.grid
            if at >= c:
                return max(line - c, 0)
            below = [p for p in self.reader.checkpoint_positions(session) if p <= at]
            return line - max(below, default=0)

    def catch_up(self, session: str, at: int, cancelled: threading.Event | None = None) -> int:
        """Read the chunks a question or fork at `at` needs one at a time, taking the lock for
        each, so a host's call waits at most one chunk (the ask itself would read them all
        under one hold): at or above C, commit up to the grid line at or below `at`; below C,
        re-read in scratch from the newest checkpoint (Reader.prepare_fork). Returns the
        chunks read. Raises CatchUpTooLong (nothing read) past max_catchup_tokens, ClientGone
        between two chunks once `cancelled` is set (what was committed stays)."""
        need = self.catch_up_tokens(session, at)
        if self.max_catchup_tokens is not None and need > self.max_catchup_tokens:
            n, c = self.position(session)
            raise CatchUpTooLong(session, need, self.max_catchup_tokens, n - c, c)
        line, done = at // self.grid * self.grid, 0
        for _ in range(2 * line // self.grid + 2):   # bounded: another call may restart it
            _check_cancel(cancelled)
            with self.gate():
                r = self.reader
                try:
                    n, c = self._position(session)
                except KeyError:
                    return done
                if at < c:
                    k = r.prepare_fork(session, at, 1)
                elif c < line and n - c >= self.grid:
                    k = r.read(session, max_chunks=1).num_chunks
                else:
                    k = 0
                if k == 0:
                    return done
                done += k
        return done

    def ask(self, session: str, question, choices, at: int | None, fork_at: int,
            cancelled: threading.Event | None = None):
        """Reader.ask under the gate, after catch_up read toward `fork_at` (fork_position's
        answer) chunk by chunk; the answer is kept for status and the latency histogram.
        Raises as catch_up, and ClientGone before the forward once `cancelled` is set."""
        self.catch_up(session, fork_at, cancelled)
        _check_cancel(cancelled)
        with self.gate():
            ans = self.reader.ask(session, question, choices, at)
            self.ask_ms.append(ans.ms)
            line = {"session": session, "label": ans.label, "p": max(ans.probs),
                    "ms": round(ans.ms, 2), "at": ans.at, "time": time.time()}
            self.answers.append(line)
            self.last_answer[session] = line
            return ans

    def summarize(self, session: str, instruction: str, max_tokens: int, at: int | None,
                  cancelled: threading.Event | None = None):
        """Reader.summarize under the gate, held for the whole decode (after catch_up)."""
        self.catch_up(session, self.fork_position(session, at), cancelled)
        _check_cancel(cancelled)
        with self.gate():
            return self.reader.summarize(session, instruction, max_tokens, at)

    def check_exact(self, session: str) -> bool:
        """Reader.check_exact under the lock (raises ExactnessError naming what differs)."""
        with self.lock:
            return self.reader.check_exact(session)

    def check(self, session: str) -> dict:
        """check_exact as a report: {session, num_ids, committed, exact, error, ids_xxh3 (the
        xxh3-64 hex of the ids as int64 little-endian bytes, for a host to compare with what
        it served)}. KeyError for an unknown session."""
        with self.gate():
            n, c = self._position(session)
            digest = ids_digest(self.reader.ids(session))
            try:
                exact, error = self.reader.check_exact(session), None
            except ExactnessError as e:
                exact, error = False, str(e)
            return {"session": session, "num_ids": n, "committed": c, "exact": exact,
                    "error": error, "ids_xxh3": digest}
