"""When the shadow may work inside a serving engine's process (docs/vllm.md): between the
engine's steps, and within the host's share in the per-step slot.

- `Turnstile`: the one lock, admitted only between steps. A step's start closes it and waits
  for the holder's work in flight (one chunk, one event batch, one question forward), so the
  host's step waits at most that long; the shadow's threads (events, questions) take it again
  only once the step has ended.
- `StepBudget`: the per-step slot's engine-wide share. vLLM runs many requests a step; each
  turn's own ration (the scheduler's 2 % of its decode time) would add up across them, so the
  slot also keeps the whole engine's: the slot's time at most `share` of the steps' time (a
  token bucket that keeps at most one slice of unspent share), one session's ration slice a
  step, the sessions taken in turn.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Sequence


class Turnstile:
    """Args: lock (the one lock: the host interface's, re-entrant)."""

    def __init__(self, lock):
        self.lock = lock
        self._between = threading.Event()        # set: no step runs
        self._between.set()

    def step_begins(self) -> None:
        """Close, then wait for the work in flight (the holder's chunk) to end."""
        self._between.clear()
        with self.lock:
            pass

    def step_ends(self) -> None:
        self._between.set()

    @property
    def stepping(self) -> bool:
        return not self._between.is_set()

    @contextmanager
    def __call__(self):
        """Hold the lock between two steps (waiting for the step in progress to end)."""
        while True:
            self._between.wait()
            self.lock.acquire()
            if self._between.is_set():
                break
            self.lock.release()                 # a step began meanwhile: let it run
        try:
            yield
        finally:
            self.lock.release()


class StepBudget:
    """The slot's share of the engine's time, as a token bucket: each step adds `share` of its
    time to the slot's credit, at most `burst_ms` (the scheduler's slice_ms: one slice) kept
    unspent; the slot runs while the credit is above 0 and its work is taken from it. Without
    the cap an engine that stepped for an hour while the shadow had nothing to read would have
    72 s of credit (2 % of 3,600 s), and eight agents' turns, each earning its own 2 %
    ration, could then take 16 % of the host's time for minutes. Args: share (0..1,
    SHADOW_SHARE); clock (s); burst_ms (ms, >= 0)."""

    def __init__(self, share: float, clock=time.monotonic, burst_ms: float = 150.0):
        self.share, self.clock, self.burst_ms = share, clock, burst_ms
        self.steps_ms = 0.0               # the engine's steps, from their start to their end
        self.slot_ms = 0.0                # the slot's work
        self.credit_ms = 0.0              # share x steps less the slot's work, <= burst_ms
        self._began: float | None = None
        self._turn = 0

    def step_begins(self) -> None:
        self._began = self.clock()

    def step_ends(self) -> None:
        if self._began is not None:
            step_ms = (self.clock() - self._began) * 1e3
            self.steps_ms += step_ms
            self.credit_ms = min(self.credit_ms + self.share * step_ms, self.burst_ms)
            self._began = None

    def next_session(self, sessions: Sequence[str]) -> str | None:
        """The session whose ration slice this step's slot runs (in turn), or None when the
        slot has no credit left (it has used its share of the steps' time)."""
        if not sessions or self.credit_ms <= 0:
            return None
        self._turn += 1
        return sessions[self._turn % len(sessions)]

    def charge(self, ms: float) -> None:
        """The slot worked ms (taken from the credit, which may go below 0 by one slice)."""
        self.slot_ms += ms
        self.credit_ms -= ms
