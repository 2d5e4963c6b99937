"""When the shadow reads: the idle window and the in-turn ration (DESIGN.md, "The host and the
bandwidth rule"; the seed's "When it reads"). Integers and clocks only: no tensors.

- Idle window: `idle_burst()` is called every `poll_s` by a loop, and at once when the last
  open turn finishes (`idle_at_finish`: agent hosts often send the next request well within a
  poll); when the host is idle (no request runs or waits, no open turn) it reads for at most
  `idle_burst_s`, checking `host_busy()` before every chunk, so a host request waits at most
  one chunk.
- In-turn ration: `between_rounds(session)` may use `share` of the time since the host's first
  token of the turn (not since the turn's start: a long prefill must not earn decode time),
  minus what the turn used already, in slices of at most `slice_ms` of whole chunks; the next
  chunk's cost comes from the cost model. Reading goes by position, so the turn's prompt is read
  before its output.
- Which session: one with a pending question whose grid line it has not reached, then the
  session of the most recent turn, then the others by recency. A question asked at position p is
  answered when its session's C reaches the grid line at or below p, before C moves past it.
"""
from __future__ import annotations

import os
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

EPS_MS = 1e-6     # clock arithmetic in float seconds must not drop a chunk that fits exactly
IDLE_MEMO_S = 0.1  # how long Scheduler.leave_to_idle's answer is kept (s)


@dataclass(frozen=True)
class SchedulerConfig:
    """poll_s: idle poll period (s); idle_burst_s: longest idle burst (s); share: the turn's
    ration as a fraction of the time since its first token; slice_ms: longest ration slice;
    grid: the reader's chunk length; turn_timeout_s: an open turn with no event for this long
    is taken as abandoned (a crashed client must not keep the idle window shut); idle_trust:
    how much of the idle window the host's recent gaps promise the ration leaves to it (0, the
    seed's behaviour: none; 0.5, the default: a ration slice is skipped while every session's
    backlog costs at most half the reading the shortest quarter of the last 16 gaps allows; on
    the recorded timelines it costs 0.15 points of freshness and saves a sixth of the ration,
    BENCHMARKS.md); idle_at_finish: the
    idle loop polls at once when the last open turn finishes instead of at its next poll (on
    the recorded timelines half the misses were gaps shorter than a poll; BENCHMARKS.md).
    Defaults are the seed's values, except these two additions."""

    poll_s: float = 0.2
    idle_burst_s: float = 2.0
    share: float = 0.02
    slice_ms: float = 150.0
    grid: int = 512
    turn_timeout_s: float = 600.0
    idle_trust: float = 0.5
    idle_at_finish: bool = True

    @classmethod
    def from_env(cls, env=None, grid: int = 512) -> "SchedulerConfig":
        """SHADOW_POLL_S, SHADOW_IDLE_BURST_S, SHADOW_SHARE, SHADOW_SLICE_MS,
        SHADOW_TURN_TIMEOUT_S, SHADOW_IDLE_TRUST (numbers) and SHADOW_IDLE_AT_FINISH (0 or 1),
        also with the prefix QWEN38_; ValueError naming a variable that is not a number (or
        not 0/1)."""
        env = os.environ if env is None else env
        kw = {}
        for name, key in (("poll_s", "POLL_S"), ("idle_burst_s", "IDLE_BURST_S"),
                          ("share", "SHARE"), ("slice_ms", "SLICE_MS"),
                          ("turn_timeout_s", "TURN_TIMEOUT_S"), ("idle_trust", "IDLE_TRUST")):
            for var in (f"SHADOW_{key}", f"QWEN38_SHADOW_{key}"):
                if env.get(var):
                    try:
                        kw[name] = float(env[var])
                    except ValueError:
                        raise ValueError(f"{var}={env[var]!r} is not a number") from None
                    break
        for var in ("SHADOW_IDLE_AT_FINISH", "QWEN38_SHADOW_IDLE_AT_FINISH"):
            if env.get(var):
                if env[var] not in ("0", "1"):
                    raise ValueError(f"{var}={env[var]!r} must be 0 or 1")
                kw["idle_at_finish"] = env[var] == "1"
                break
        return cls(grid=grid, **kw)


class CostModel:
    """Estimated ms of the next chunk at a context length: the mean of the last `keep` chunks
    measured in the same band of `band_tokens`, else `default_ms_per_1k` x grid / 1000."""

    def __init__(self, default_ms_per_1k: float, grid: int, band_tokens: int = 8192,
                 keep: int = 4):
        self.default_ms = default_ms_per_1k * grid / 1000
        self.band_tokens, self.keep = band_tokens, keep
        self.seen: dict[int, deque] = {}

    def estimate(self, context: int) -> float:
        seen = self.seen.get(context // self.band_tokens)
        return sum(seen) / len(seen) if seen else self.default_ms

    def observe(self, context: int, ms: float) -> None:
        self.seen.setdefault(context // self.band_tokens, deque(maxlen=self.keep)).append(ms)


class VirtualClock:
    """An injectable clock for tests and simulations: seconds in `t`, moved by hand."""

    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class ReaderPort(Protocol):
    """What the scheduler needs of a reader (the real one, or a simulation)."""

    def backlog(self, session: str) -> int: ...
    def committed(self, session: str) -> int: ...
    def read_chunk(self, session: str) -> float: ...          # one chunk; returns its ms
    def answer(self, session: str, at: int) -> None: ...      # a pending question is due


@dataclass
class Turn:
    started_s: float
    first_token_s: float | None = None
    used_ms: float = 0.0
    last_event_s: float = 0.0


@dataclass(frozen=True)
class Slice:
    """What one call did: kind ("idle" or "ration"), per session the chunks read, the ms spent,
    and why it stopped ("budget", "host", "fresh", "ration", "idle": left to the idle window)."""

    kind: str
    chunks: tuple[tuple[str, int], ...]
    ms: float
    stop: str


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

    # -- host events ----------------------------------------------------------------------------
    def turn_started(self, session: str) -> None:
        self._close(session)                 # a turn still open for the session ends here
        self.idle_memo = None
        now = self.clock()
        if not self.turns and self.idle_since_s is not None:
            self.gaps.append(now - self.idle_since_s)
        self.idle_since_s = None
        self.turns[session] = Turn(now, last_event_s=now)
        self._touch(session)

    def output(self, session: str) -> None:
        """The host produced ids; the first call of a turn marks its first token."""
        turn = self.turns.get(session)
        if turn is not None:
            turn.last_event_s = self.clock()
            if turn.first_token_s is None:
                turn.first_token_s = turn.last_event_s

    def turn_finished(self, session: str) -> bool:
        """Close the turn. Returns True when the idle window should be polled now (the last
        open turn finished and idle_at_finish is on)."""
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

    def add_question(self, session: str, at: int) -> None:
        """A question at position `at`, answered when C reaches the grid line at or below it."""
        self.questions.append((session, at))
        self._answer_due(session)

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

    def _read(self, session: str, spent: list, done: dict) -> None:
        context = self.port.committed(session)
        ms = self.port.read_chunk(session)
        self.idle_memo = None
        self.cost.observe(context, ms)
        spent[0] += ms
        done[session] = done.get(session, 0) + 1
        self._answer_due(session)

    # -- the two windows ------------------------------------------------------------------------
    def idle_burst(self) -> Slice | None:
        """One idle-window burst; None when the host is busy or a turn is open (turns idle for
        turn_timeout_s are closed first). `lock` is taken for each step, not the burst."""
        with self.lock:
            now = self.clock()
            for session, turn in list(self.turns.items()):
                if now - turn.last_event_s > self.cfg.turn_timeout_s:
                    self.turn_finished(session)          # abandoned: closed as finished
            if self.turns or self.host_busy():
                return None
        start, spent, done = self.clock(), [0.0], {}
        while True:
            with self.lock:
                stop = self._idle_step(start, spent, done)
            if stop:
                return Slice("idle", tuple(done.items()), spent[0], stop)

    def _idle_step(self, start: float, spent: list, done: dict) -> str | None:
        """Read one chunk of the burst, or say why the burst stops."""
        if self.turns or self.host_busy():
            return "host"
        session = self.pick()
        if session is None:
            return "fresh"
        left_ms = (start + self.cfg.idle_burst_s - self.clock()) * 1e3
        if self.cost.estimate(self.port.committed(session)) > left_ms + EPS_MS:
            return "budget"
        self._read(session, spent, done)
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
        gaps (between the end of one turn and the start of the next, no turn open), minus a
        poll unless the idle window opens at the finish; 0 with fewer than 4 gaps seen."""
        if len(self.gaps) < 4:
            return 0.0
        q25 = sorted(self.gaps)[len(self.gaps) // 4]
        return max(0.0, q25 - (0.0 if self.cfg.idle_at_finish else self.cfg.poll_s)) * 1e3

    def leave_to_idle(self, session: str) -> bool:
        """Whether the ration leaves the reading to the idle window: idle_trust > 0, no
        question pending on this session, and every session's backlog (whole chunks, at the
        cost model's estimate) within idle_trust x expected_idle_ms. The answer is kept for
        IDLE_MEMO_S (the host asks every round; summing every session's backlog each time
        cost it 0.7 % of its decode on the H200, BENCHMARKS.md); a turn's start or finish, a
        forget or a chunk read drops it (output growth within the 0.1 s does not: a stale
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
        budget = min(self.ration_ms(session), self.cfg.slice_ms)
        if self.cost.estimate(self.port.committed(session)) > budget + EPS_MS:
            return "ration"
        return None

    def slice_due(self, session: str) -> bool:
        """Whether between_rounds would read a chunk now (slice_stop is None)."""
        return self.slice_stop(session) is None

    def charge(self, session: str, ms: float) -> None:
        """Count ms more against the open turn's ration (what a slice cost beyond its chunks:
        the syncs and the host-side work around them)."""
        if session in self.turns and ms > 0:
            self.turns[session].used_ms += ms

    def between_rounds(self, session: str) -> Slice:
        """One ration slice for the session of an open turn: whole chunks whose estimated cost
        fits in min(ration, slice_ms)."""
        budget = min(self.ration_ms(session), self.cfg.slice_ms)
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
