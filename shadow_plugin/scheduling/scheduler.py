"""When the shadow reads: the idle window and the in-turn ration (docs/design.md, "The host and the
bandwidth rule"; the seed's "When it reads"). Integers and clocks only: no tensors.

- Idle window: `idle_burst()` is called every `poll_s` by a loop, and at once when the last
  open turn finishes (`idle_at_finish`: agent hosts often send the next request well within a
  poll); when the host is idle (no request runs or waits, no open turn) it reads for at most
  `idle_burst_s`, checking `host_busy()` before every chunk, so a host request waits at most
  one chunk.
- In-turn ration: `between_rounds(session)` may use `share` of the time since the host's first
  token of the turn (not since the turn's start: a long prefill must not earn decode time),
  minus what the turn used already, in slices of at most `slice_ms` of whole chunks; the next
  chunk's cost comes from the cost model, and a slice's own cost beyond its chunks (the host's
  device syncs around it) from what the last slices were charged (`charge`; at most the chunk's
  estimate, so one stall does not hold the slices off for good), so a slice starts only when
  both fit the ration (slice_ms bounds the chunks). Reading goes by position, so the turn's
  prompt is read before its output.
- Tails: once every session is fresh, the idle window forwards the tail of a question at the
  end of the most recent sessions (Reader.make_tail, shadow_plugin.reader.tails), so that a
  question there forwards its own ids and fewer of the session's (fork.tail_cut).
- Which session: one with a pending question whose grid line it has not reached, then the
  session of the most recent turn, then the others by recency. A question asked at position p is
  answered when its session's C reaches the grid line at or below p, before C moves past it.
- Batches (`batch_sessions` > 1, SHADOW_BATCH_SESSIONS): the idle window reads one chunk of
  each of up to that many sessions with whole chunks waiting, in that order, in one forward
  (the port's read_chunks, Reader.read_batch: each session committed as if read alone), so a
  host request waits at most one batched chunk; the batch is cut to what the burst's budget
  holds by the cost model's batch estimate. The ration stays one session's chunks (its turn's
  share), one at a time.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from shadow_plugin.scheduling.sched_types import (
    CostModel,
    ReaderPort,
    SchedulerConfig,
    Slice,
    Turn,
    VirtualClock,
)

__all__ = ["EPS_MS", "IDLE_MEMO_S", "CostModel", "ReaderPort", "Scheduler", "SchedulerConfig",
           "Slice", "Turn", "VirtualClock"]       # the data types live in sched_types

EPS_MS = 1e-6     # clock arithmetic in float seconds must not drop a chunk that fits exactly
IDLE_MEMO_S = 0.1  # how long Scheduler.leave_to_idle's answer is kept (s)


@dataclass
class Scheduler:
    """Decides and runs reading slices; `clock()` returns seconds, `host_busy()` the host's
    load signal (a request runs or waits, or a lock forbids the GPU)."""

    cfg: SchedulerConfig
    port: ReaderPort
    clock: Callable[[], float]
    host_busy: Callable[[], bool]
    cost: CostModel
    turns: dict[str, Turn] = field(default_factory=dict)
    recency: list[str] = field(default_factory=list)
    questions: list[tuple[str, int]] = field(default_factory=list)
    # Held around each idle-burst step (a decision and one chunk), so host events wait at most
    # one chunk for a burst; the in-process Host passes its reader lock.
    lock: Any = field(default_factory=threading.RLock)
    gaps: deque = field(default_factory=lambda: deque(maxlen=16))   # host idle gaps, s
    closed_ration_ms: float = 0.0      # ration used by turns now closed
    closed_decode_ms: float = 0.0      # their time from first token to close
    idle_since_s: float | None = None                                 # no turn open since
    idle_memo: tuple[float, bool] | None = None     # (clock s, leave_to_idle's answer)
    # what the last ration slices cost beyond their chunks (ms: the host's device syncs before
    # and after, the bookkeeping), as charged; a slice is started only when its chunk and this
    # fit the ration, so the ration holds to its share with the syncs counted
    slice_overheads: deque = field(default_factory=lambda: deque(maxlen=4))

    # -- host events ----------------------------------------------------------------------------
    def turn_started(self, session: str) -> None:
        self._close(session)                 # a turn still open for the session ends here
        self.idle_memo = None
        now = self.clock()
        if not self.turns:
            self._gap_ends(now)
        self.idle_since_s = None
        self.turns[session] = Turn(now, last_event_s=now)
        self._touch(session)

    def output(self, session: str) -> None:
        """The host produced ids; the first call of a turn marks its first token. A session
        the scheduler has not seen a turn of (one a restarted service continues with outputs)
        joins the idle window's order as its least recent."""
        self._know(session)
        turn = self.turns.get(session)
        if turn is not None:
            turn.last_event_s = self.clock()
            if turn.first_token_s is None:
                turn.first_token_s = turn.last_event_s

    def turn_finished(self, session: str) -> bool:
        """Close the turn. Returns True when the idle window should be polled now (the last
        open turn finished and idle_at_finish is on)."""
        self._know(session)
        self._close(session)
        self.idle_memo = None
        if not self.turns:
            self.idle_since_s = self.clock()
        return self.cfg.idle_at_finish and not self.turns

    def forget(self, session: str) -> None:
        """The session is gone (deleted): no turn, no recency, no pending questions."""
        self._close(session)
        self.idle_memo = None
        self.recency = [s for s in self.recency if s != session]
        self.questions = [q for q in self.questions if q[0] != session]

    def _gap_ends(self, now: float) -> None:
        """The host's idle gap ends now (recorded for idle trust, once)."""
        if self.idle_since_s is not None:
            self.gaps.append(now - self.idle_since_s)
            self.idle_since_s = None

    def _close(self, session: str) -> None:
        turn = self.turns.pop(session, None)
        if turn is not None and turn.first_token_s is not None:
            self.closed_ration_ms += turn.used_ms
            self.closed_decode_ms += (self.clock() - turn.first_token_s) * 1e3

    def host_share(self) -> tuple[float, float]:
        """(ms of ration used, ms of host decode it was earned over: from each turn's first
        token to its close, or to now for open turns), since the start."""
        now = self.clock()
        open_turns = [t for t in self.turns.values() if t.first_token_s is not None]
        return (self.closed_ration_ms + sum(t.used_ms for t in open_turns),
                self.closed_decode_ms + sum((now - t.first_token_s) * 1e3 for t in open_turns))

    def stalled(self) -> dict | None:
        """Why the idle window reads nothing now, or None when it may: `turn_open` (the idle
        window waits for every open turn to finish; inside a turn the shadow reads only in the
        ration between the host's rounds), with each open turn's session, seconds since it
        opened, since its first token, since its last event, since its last round (None: none
        yet), and until turn_timeout_s closes it as abandoned; or `host_busy` (the host's own
        signal says a request it serves runs or waits)."""
        now = self.clock()
        if self.turns:
            return {"why": "turn_open", "turns": [
                {"session": sid, "open_s": round(now - t.started_s, 3),
                 "since_first_token_s": None if t.first_token_s is None
                 else round(now - t.first_token_s, 3),
                 "since_last_event_s": round(now - t.last_event_s, 3),
                 "since_last_round_s": None if t.last_round_s is None
                 else round(now - t.last_round_s, 3),
                 "closes_in_s": round(max(0.0, self.cfg.turn_timeout_s
                                          - (now - t.last_event_s)), 3)}
                for sid, t in sorted(self.turns.items(), key=lambda kv: kv[1].started_s)]}
        if self.host_busy():
            return {"why": "host_busy"}
        return None

    def add_question(self, session: str, at: int) -> None:
        """A question at position `at`, answered when C reaches the grid line at or below it."""
        self.questions.append((session, at))
        self._answer_due(session)

    def _know(self, session: str) -> None:
        if session not in self.recency:
            self.recency.insert(0, session)

    def _touch(self, session: str) -> None:
        if session in self.recency:
            self.recency.remove(session)
        self.recency.append(session)

    # -- choosing -------------------------------------------------------------------------------
    def _line(self, at: int) -> int:
        return at // self.cfg.grid * self.cfg.grid

    def _answer_due(self, session: str) -> None:
        c = self.port.committed(session)
        for q in [q for q in self.questions if q[0] == session and self._line(q[1]) <= c]:
            self.questions.remove(q)
            self.port.answer(*q)

    def _readable(self, session: str) -> bool:
        return self.port.backlog(session) >= self.cfg.grid

    def pick(self) -> str | None:
        """The next session to read in the idle window, or None when all are fresh."""
        for session, at in self.questions:
            if self.port.committed(session) < self._line(at) and self._readable(session):
                return session
        for session in reversed(self.recency):
            if self._readable(session):
                return session
        return None

    def ahead_of(self, session: str) -> list[str]:
        """The sessions the idle window reads before `session`, in pick's order (each with a
        chunk of backlog or more): those with a question whose line they have not reached,
        then, unless `session` has such a question, those of more recent turns. A session
        the scheduler has seen no turn or output of comes after all the others."""
        pending = [s for s, at in self.questions
                   if self.port.committed(s) < self._line(at) and self._readable(s)]
        first = list(dict.fromkeys(s for s in pending if s != session))
        if session in pending:
            return first
        newer = self.recency[self.recency.index(session) + 1:] \
            if session in self.recency else self.recency
        return first + [s for s in reversed(newer) if s not in first and self._readable(s)]

    def pick_many(self, limit: int) -> list[str]:
        """Up to `limit` sessions to read a chunk of, in `pick`'s order: those with a pending
        question below its line first, then by recency; each with a whole chunk waiting."""
        out: list[str] = []
        for session, at in self.questions:
            if self.port.committed(session) < self._line(at) and self._readable(session) and \
                    session not in out:
                out.append(session)
        for session in reversed(self.recency):
            if session not in out and self._readable(session):
                out.append(session)
        return out[:limit]

    def _batch_estimate(self, sessions: list[str]) -> float:
        """The cost model's estimate for one chunk of each (one forward; context: the
        longest)."""
        context = max(self.port.committed(s) for s in sessions)
        return self.cost.estimate(context, len(sessions))

    def _read_many(self, sessions: list[str], spent: list, done: dict) -> None:
        context = max(self.port.committed(s) for s in sessions)
        ms, read = self.port.read_chunks(sessions)
        self.idle_memo = None
        if read:
            self.cost.observe(context, ms, len(read))
        spent[0] += ms
        for session in read:
            done[session] = done.get(session, 0) + 1
        for session in sessions:
            self._answer_due(session)

    def _read(self, session: str, spent: list, done: dict) -> None:
        context = self.port.committed(session)
        ms = self.port.read_chunk(session)
        self.idle_memo = None
        self.cost.observe(context, ms)
        spent[0] += ms
        done[session] = done.get(session, 0) + 1
        self._answer_due(session)

    # -- the two windows ------------------------------------------------------------------------
    def idle_burst(self, stop: Callable[[], bool] = lambda: False) -> Slice | None:
        """One idle-window burst; None when the host is busy or a turn is open (turns idle for
        turn_timeout_s are closed first). `lock` is taken for each step, not the burst;
        `stop()` is asked before each chunk too (the loop is being stopped: "stopped")."""
        with self.lock:
            now = self.clock()
            for session, turn in list(self.turns.items()):
                if now - turn.last_event_s > self.cfg.turn_timeout_s:
                    self.turn_finished(session)          # abandoned: closed as finished
            if self.turns:
                return None
            if self.host_busy():
                self._gap_ends(now)       # a request the shadow does not follow
                return None
            if self.idle_since_s is None:
                self.idle_since_s = now   # idle again after such a request (within a poll)
        start, spent, done = self.clock(), [0.0], {}
        while True:
            with self.lock:
                why = "stopped" if stop() else self._idle_step(start, spent, done)
            if why:
                return Slice("idle", tuple(done.items()), spent[0], why)

    def _idle_step(self, start: float, spent: list, done: dict) -> str | None:
        """Read one chunk of the burst, or say why the burst stops. A burst's first chunk is
        read whatever its estimate: one estimated past the whole burst (a loaded CPU, a long
        context) would otherwise never be read, and its estimate never corrected."""
        if self.turns or self.host_busy():
            return "host"
        if self.cfg.batch_sessions > 1:
            return self._idle_batch(start, spent, done)
        session = self.pick()
        if session is None:
            return self._idle_tail(spent)
        left_ms = (start + self.cfg.idle_burst_s - self.clock()) * 1e3
        if done and self.cost.estimate(self.port.committed(session)) > left_ms + EPS_MS:
            return "budget"
        self._read(session, spent, done)
        return None

    def _idle_tail(self, spent: list) -> str | None:
        """Every session fresh: the tail of a question at the end of a recent session
        (ReaderPort.make_tail, the most recent first), so that a question there forwards only
        its own ids and a few of the session's; "fresh" when none is due. A tail is less than
        a chunk's forward, so it is not held to the burst's budget (a host request still
        waits at most one chunk)."""
        ms = self.port.make_tail(list(reversed(self.recency))) if self.recency else None
        if ms is None:
            return "fresh"
        self.idle_memo = None
        spent[0] += ms
        return None

    def _idle_batch(self, start: float, spent: list, done: dict) -> str | None:
        """_idle_step's batch: up to batch_sessions sessions (pick_many), fewer while their
        batch estimate passes what the burst has left; one at a time through the port's
        read_chunk when one is left."""
        sessions = self.pick_many(self.cfg.batch_sessions)
        if not sessions:
            return self._idle_tail(spent)
        left_ms = (start + self.cfg.idle_burst_s - self.clock()) * 1e3
        while len(sessions) > 1 and self._batch_estimate(sessions) > left_ms + EPS_MS:
            sessions.pop()
        if len(sessions) == 1:
            if self.cost.estimate(self.port.committed(sessions[0])) > left_ms + EPS_MS:
                return "budget"
            self._read(sessions[0], spent, done)
        else:
            self._read_many(sessions, spent, done)
        return None

    def ration_ms(self, session: str) -> float:
        """What the turn may still spend: share x ms since its first token, minus used."""
        turn = self.turns.get(session)
        if turn is None or turn.first_token_s is None:
            return 0.0
        earned = self.cfg.share * (self.clock() - turn.first_token_s) * 1e3
        return max(0.0, earned - turn.used_ms)

    def expected_idle_ms(self) -> float:
        """Reading time the idle window promises: the shortest quarter of the last 16 host
        gaps (from the end of a turn, no turn open, to the next turn's start or to an idle
        poll that finds the host busy with a request the shadow does not follow), minus a
        poll unless the idle window opens at the finish; 0 with fewer than 4 gaps seen."""
        if len(self.gaps) < 4:
            return 0.0
        q25 = sorted(self.gaps)[len(self.gaps) // 4]
        return max(0.0, q25 - (0.0 if self.cfg.idle_at_finish else self.cfg.poll_s)) * 1e3

    def leave_to_idle(self, session: str) -> bool:
        """Whether the ration leaves the reading to the idle window: idle_trust > 0, no
        question pending on this session, and every session's backlog (whole chunks, at the
        cost model's estimate) within idle_trust x expected_idle_ms. The answer is kept for
        IDLE_MEMO_S (the host asks every round: with 11 sessions a round costs 13 us kept
        against 22 us asked afresh, evals/host_calls.py at cadb457 on a CPU); a turn's start or
        finish, a forget or a chunk read drops it (output growth within the 0.1 s does not: a stale
        answer delays the ration, which keeps accruing, or reads 0.1 s longer)."""
        if self.cfg.idle_trust <= 0 or any(q[0] == session for q in self.questions):
            return False
        now = self.clock()
        if self.idle_memo is not None and now - self.idle_memo[0] < IDLE_MEMO_S - 1e-9:
            return self.idle_memo[1]
        promised = self.cfg.idle_trust * self.expected_idle_ms()
        need, leave = 0.0, True
        for s in reversed(self.recency):                     # newest first: most backlog
            need += self.port.backlog(s) // self.cfg.grid * self.cost.estimate(
                self.port.committed(s))
            if need > promised:
                leave = False
                break
        self.idle_memo = (now, leave)
        return leave

    def slice_stop(self, session: str) -> str | None:
        """None when between_rounds would read a chunk now, else why not: "fresh" (less than
        a chunk of backlog), "idle" (left to the idle window) or "ration" (the next chunk does
        not fit). The host skips the call's device syncs when it is not None."""
        if not self._readable(session):
            return "fresh"
        if self.leave_to_idle(session):
            return "idle"
        chunk_ms = self.cost.estimate(self.port.committed(session))
        if chunk_ms > self._slice_budget_ms(session, chunk_ms) + EPS_MS:
            return "ration"
        return None

    def _slice_budget_ms(self, session: str, chunk_ms: float) -> float:
        """What a slice's chunks may cost (ms): the turn's ration less the slice's expected
        overhead, at most slice_ms (slice_ms bounds the chunks; the overhead is paid from the
        ration). The overhead expected is at most chunk_ms, the next chunk's estimate (ms): a
        stall charged to one slice (a first sync behind the host's long prefill) must not hold
        the slices off for good, since only a slice that runs is charged anew."""
        overhead_ms = min(self.slice_overhead_ms(), chunk_ms)
        return min(self.ration_ms(session) - overhead_ms, self.cfg.slice_ms)

    def slice_overhead_ms(self) -> float:
        """What a ration slice is expected to cost beyond its chunks: the mean of the last 4
        slices' charges (ms), 0 before any (a slice's budget counts at most the next chunk's
        estimate of it: _slice_budget_ms)."""
        seen = self.slice_overheads
        return sum(seen) / len(seen) if seen else 0.0

    def slice_due(self, session: str) -> bool:
        """Whether between_rounds would read a chunk now (slice_stop is None)."""
        return self.slice_stop(session) is None

    def charge(self, session: str, ms: float) -> None:
        """Count ms more against the open turn's ration (what a slice cost beyond its chunks:
        the syncs and the host-side work around them); later slices expect as much
        (slice_overhead_ms). On an H100 inside vLLM a slice's syncs cost about 6 ms (most of
        it the first, waiting for the host's queued steps) beside its 6.5-ms chunk, and
        slices started on the chunk's estimate alone spent
        44-55 ms of a ration of 31-33 ms (BENCHMARKS.md, "The peer and the host's cost on one
        H100, a second session")."""
        if ms > 0:
            self.slice_overheads.append(ms)
        if session in self.turns and ms > 0:
            self.turns[session].used_ms += ms

    def between_rounds(self, session: str) -> Slice:
        """One ration slice for the session of an open turn: whole chunks whose estimated cost
        fits in the ration less the slice's expected overhead (slice_overhead_ms, at most the
        first chunk's estimate), and in slice_ms."""
        if session in self.turns:
            self.turns[session].last_round_s = self.clock()
        budget = self._slice_budget_ms(session, self.cost.estimate(self.port.committed(session)))
        spent, done = [0.0], {}
        stop = "fresh"
        if self.leave_to_idle(session):
            return Slice("ration", (), 0.0, "idle")
        while self._readable(session):
            if self.cost.estimate(self.port.committed(session)) > budget - spent[0] + EPS_MS:
                stop = "ration"
                break
            self._read(session, spent, done)
        if session in self.turns:
            self.turns[session].used_ms += spent[0]
        return Slice("ration", tuple(done.items()), spent[0], stop)
