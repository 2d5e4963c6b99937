"""The scheduler's data: its configuration, the chunk cost model, a virtual clock, what it needs
of a reader, and what one call did (shadow_plugin.scheduling.scheduler decides; integers and
clocks only)."""
from __future__ import annotations

import math
import os
from collections import deque
from dataclasses import dataclass
from typing import Protocol

# field -> (test, what it must be): the ranges SchedulerConfig and from_env check
RANGES = {"poll_s": (lambda v: v > 0, "> 0"), "idle_burst_s": (lambda v: v > 0, "> 0"),
          "share": (lambda v: 0 <= v <= 1, "in [0, 1]"), "slice_ms": (lambda v: v > 0, "> 0"),
          "turn_timeout_s": (lambda v: v > 0, "> 0"), "idle_trust": (lambda v: v >= 0, ">= 0")}


def check_range(name: str, value: float) -> float:
    """value when finite and within RANGES[name]; else ValueError naming the field."""
    test, want = RANGES[name]
    if not (math.isfinite(value) and test(value)):
        raise ValueError(f"{name} must be finite and {want}, got {value!r}")
    return value


MAX_BATCH_SESSIONS = 64


def check_batch(value) -> int:
    """value when an integer in [1, MAX_BATCH_SESSIONS]; else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or \
            not 1 <= value <= MAX_BATCH_SESSIONS:
        raise ValueError(f"batch_sessions must be an integer in [1, {MAX_BATCH_SESSIONS}], "
                         f"got {value!r}")
    return value


@dataclass(frozen=True)
class SchedulerConfig:
    """poll_s: idle poll period (s); idle_burst_s: longest idle burst (s); share: the turn's
    ration as a fraction of the time since its first token; slice_ms: longest ration slice;
    grid: the reader's chunk length; turn_timeout_s: an open turn with no event for this long
    is taken as abandoned (a crashed client must not keep the idle window shut); idle_trust:
    how much of the idle window the host's recent gaps promise the ration leaves to it (0, the
    seed's behaviour: none; 0.5, the default: a ration slice is skipped while every session's
    backlog costs at most half the reading the shortest quarter of the last 16 gaps allows; on
    the recorded timelines it costs 0.2 points of freshness and saves a sixth of the ration,
    BENCHMARKS.md); idle_at_finish: the idle loop polls at once when the last open turn
    finishes instead of at its next poll (on the recorded timelines three quarters of the
    seed's misses came after gaps shorter than a poll; BENCHMARKS.md); batch_sessions: the
    idle window reads one chunk of each of up to this many sessions in one forward
    (Reader.read_batch; 1, the default: one chunk at a time, until the GPU measures the
    batched read). Defaults are the seed's values, except these additions."""

    poll_s: float = 0.2
    idle_burst_s: float = 2.0
    share: float = 0.02
    slice_ms: float = 150.0
    grid: int = 512
    turn_timeout_s: float = 600.0
    idle_trust: float = 0.5
    idle_at_finish: bool = True
    batch_sessions: int = 1

    def __post_init__(self) -> None:
        """ValueError naming the field for a value out of range (every number finite)."""
        for name in RANGES:
            check_range(name, getattr(self, name))
        check_batch(self.batch_sessions)

    @classmethod
    def from_env(cls, env=None, grid: int = 512) -> "SchedulerConfig":
        """SHADOW_POLL_S, SHADOW_IDLE_BURST_S, SHADOW_SHARE, SHADOW_SLICE_MS,
        SHADOW_TURN_TIMEOUT_S, SHADOW_IDLE_TRUST (numbers), SHADOW_IDLE_AT_FINISH (0 or 1) and
        SHADOW_BATCH_SESSIONS (an integer, 1-64); ValueError naming a variable that is not a
        number (or not 0/1, or not such an integer), or out of its range."""
        env = os.environ if env is None else env
        kw = {}
        for name, key in (("poll_s", "POLL_S"), ("idle_burst_s", "IDLE_BURST_S"),
                          ("share", "SHARE"), ("slice_ms", "SLICE_MS"),
                          ("turn_timeout_s", "TURN_TIMEOUT_S"), ("idle_trust", "IDLE_TRUST")):
            var = f"SHADOW_{key}"
            if env.get(var):
                try:
                    value = float(env[var])
                except ValueError:
                    raise ValueError(f"{var}={env[var]!r} is not a number") from None
                try:
                    kw[name] = check_range(name, value)
                except ValueError as e:
                    raise ValueError(f"{var}={env[var]!r}: {e}") from None
        var = "SHADOW_BATCH_SESSIONS"
        if env.get(var):
            try:
                value = int(env[var])
            except ValueError:
                raise ValueError(f"{var}={env[var]!r} is not an integer") from None
            try:
                kw["batch_sessions"] = check_batch(value)
            except ValueError as e:
                raise ValueError(f"{var}={env[var]!r}: {e}") from None
        var = "SHADOW_IDLE_AT_FINISH"
        if env.get(var):
            if env[var] not in ("0", "1"):
                raise ValueError(f"{var}={env[var]!r} must be 0 or 1")
            kw["idle_at_finish"] = env[var] == "1"
        return cls(grid=grid, **kw)


class CostModel:
    """Estimated ms of the next chunk at a context length: the mean of the last `keep` chunks
    measured in the same band of `band_tokens`, else `default_ms_per_1k` x grid / 1000. A
    batch of num_sessions chunks (one forward, context: its longest) has estimates of its own:
    the mean of the last `keep` such batches in the band, else num_sessions chunks' estimate
    (a batch costs at most its chunks one at a time)."""

    def __init__(self, default_ms_per_1k: float, grid: int, band_tokens: int = 8192,
                 keep: int = 4):
        self.default_ms = default_ms_per_1k * grid / 1000
        self.band_tokens, self.keep = band_tokens, keep
        self.seen: dict = {}

    def _key(self, context: int, num_sessions: int):
        band = context // self.band_tokens
        return band if num_sessions == 1 else (band, num_sessions)

    def estimate(self, context: int, num_sessions: int = 1) -> float:
        seen = self.seen.get(self._key(context, num_sessions))
        if seen:
            return sum(seen) / len(seen)
        if num_sessions > 1:
            return num_sessions * self.estimate(context)
        return self.default_ms

    def observe(self, context: int, ms: float, num_sessions: int = 1) -> None:
        self.seen.setdefault(self._key(context, num_sessions),
                             deque(maxlen=self.keep)).append(ms)


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
    # one chunk of each in one forward (only with batch_sessions > 1): (ms, sessions read)
    def read_chunks(self, sessions: list[str]) -> tuple[float, list[str]]: ...
    def answer(self, session: str, at: int) -> None: ...      # a pending question is due
    # the tail of a question at the end of the first of `sessions` (most recent first) that
    # has one due, forwarded and kept (Reader.make_tail): its ms; None when none is due (a
    # simulation: None)
    def make_tail(self, sessions: list[str]) -> float | None: ...


@dataclass
class Turn:
    """An open turn's clock readings (s): started, first token (None: none yet), ration used
    (ms), last host event, last round (None: no round yet)."""

    started_s: float
    first_token_s: float | None = None
    used_ms: float = 0.0
    last_event_s: float = 0.0
    last_round_s: float | None = None


@dataclass(frozen=True)
class Slice:
    """What one call did: kind ("idle" or "ration"), per session the chunks read, the ms spent,
    and why it stopped ("budget", "host", "fresh", "ration", "idle": left to the idle window,
    "stopped": the idle loop is being stopped)."""

    kind: str
    chunks: tuple[tuple[str, int], ...]
    ms: float
    stop: str
