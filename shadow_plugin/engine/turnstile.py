"""When the shadow may work inside a serving engine's process (docs/vllm.md): between the
engine's steps, and within the host's share in the per-step slot.

- `Turnstile`: the one lock, admitted only between steps. A step's start first lets in the
  shadow's threads (events, questions) that asked before it, then closes and waits for the
  work in flight (one chunk, one event batch, one question forward), so the host's step waits
  at most one hold a thread, and a host that steps back to back still lets them in.
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
from typing import Callable, Sequence


class Turnstile:
    """The one lock, admitted between steps, first come first served at each step's start.

    A shadow thread that asks to get in (`with turnstile():`) is admitted only while no step
    runs; a step's start (`step_begins`, on the host's thread) first lets in every shadow
    thread that asked before it (each then does one hold's work: an event batch, a question's
    step), then closes, then waits for the work in flight (a hold, or the idle loop's chunk,
    which takes the lock itself). Without the hand-off a host that steps back to back and
    holds the GIL through each step (vLLM on a GPU: a 4-ms decode step of launches and Python,
    microseconds between steps) never let the shadow in while it had requests: by the time a
    woken thread held the GIL the next step had begun (seen on an H100: a turn's prompt
    reached the shadow only once the host went idle; tests/unit/test_turnstile.py). So a step
    waits for at most one hold per shadow thread, as the design says (docs/vllm.md).

    Args: lock (the one lock: the host interface's, re-entrant); max_wait_s (how long a step's
    start waits for the threads that asked before it: a bound against a thread that asked and
    stalls elsewhere; they come in at a later step's start); gc_ms (a clock of the process's
    garbage collections, ms: GcPauses.total_ms's reader; the collections during the longest
    hold are its difference)."""

    def __init__(self, lock, max_wait_s: float = 1.0, gc_ms: Callable[[], float] = lambda: 0.0):
        self.lock = lock
        self.max_wait_s = max_wait_s
        self.gc_ms = gc_ms
        self._cond = threading.Condition(threading.Lock())   # the fields below
        self._stepping = False
        self._due: int | None = None  # while a step starts or runs: the holds it lets in first
        self._asked = 0               # holds asked for since the start (a hold's ticket)
        self._settled = 0             # of them, those that got in (or gave up asking)
        self._inside = threading.local()  # depth: this thread's holds, nested
        self._holding = 0             # outer holds inside now (in from their ticket to out)
        self.hold_max_ms = 0.0        # the longest one hold (outer), from in to out
        self.hold_max_kind = ""       # ... its kind (__call__'s: "events", "route")
        self.hold_max_cpu_ms = 0.0    # ... its thread's CPU time (thread_time): well below
        #                               hold_max_ms, the hold was blocked (the GIL, the disk;
        #                               not a device sync: CUDA's spins, counted as CPU)
        self.hold_max_gc_ms = 0.0     # ... the process's collections meanwhile (ms)

    def step_begins(self) -> tuple[float, bool]:
        """Let in the shadow threads that asked before this step (holds asked for meanwhile
        wait for the next step's start), close, then wait for the work in flight (a hold, the
        idle loop's chunk) to end. A start with no end of the step before it (an engine that
        skipped one) opens the gate first: its thread is between steps. Returns (let_in_ms,
        behind_hold): the ms until the last thread let in had the lock (the work in flight
        ahead of them, their holds but the last one's; about 0 when none had asked; at most
        max_wait_s), and whether a hold through the turnstile was inside then (the last one
        let in, or one already in when the step began): the rest of the step's wait is that
        hold, else the work that took the lock itself (the idle loop's chunk), or nothing."""
        t0 = time.perf_counter()
        with self._cond:
            if self._stepping:
                self._stepping = False
                self._cond.notify_all()
            self._due, deadline = self._asked, time.monotonic() + self.max_wait_s
            while self._settled < self._due:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            self._stepping = True
            let_in_ms, behind_hold = (time.perf_counter() - t0) * 1e3, self._holding > 0
        with self.lock:
            pass
        return let_in_ms, behind_hold

    def step_ends(self) -> None:
        """Open: the holds waiting for the step go in (those it let in first are done)."""
        with self._cond:
            self._stepping, self._due = False, None
            self._cond.notify_all()

    @property
    def stepping(self) -> bool:
        return self._stepping

    def _shut(self, ticket: int) -> bool:
        """Whether the hold `ticket` must wait now (a step runs, or starts after it asked)."""
        return self._stepping or (self._due is not None and ticket >= self._due)

    @contextmanager
    def __call__(self, kind: str = "route"):
        """Hold the lock between two steps (waiting for the step in progress to end). A hold
        nested in the same thread's hold re-enters the lock at once, with no ticket: the step
        that starts meanwhile waits for the outer hold, and would wait for good for an inner
        one that waited for the step. The longest outer hold is kept (hold_max_ms: what a
        step's start may wait for one thread's hold) with its kind (hold_max_kind: "events",
        an event batch's apply; "route", the default, a question's, check's or summary's
        step through the service's gate), its thread's CPU time (hold_max_cpu_ms, from
        time.thread_time: what the hold computed, and its waits for the device, since CUDA's
        default sync spins while the process has a core to spare; the rest of it was blocked,
        on the GIL other threads held or the disk) and the process's garbage collections
        during it (hold_max_gc_ms, from gc_ms)."""
        inside = self._inside
        outer = not getattr(inside, "depth", 0)
        if outer:
            self._get_in()
        else:
            self.lock.acquire()
        inside.depth = getattr(inside, "depth", 0) + 1
        t0, cpu0, gc0 = time.perf_counter(), time.thread_time(), self.gc_ms()
        try:
            yield
        finally:
            inside.depth -= 1
            if outer:
                held_ms = (time.perf_counter() - t0) * 1e3
                if held_ms > self.hold_max_ms:
                    self.hold_max_ms, self.hold_max_kind = held_ms, kind
                    self.hold_max_cpu_ms = (time.thread_time() - cpu0) * 1e3
                    self.hold_max_gc_ms = self.gc_ms() - gc0
                with self._cond:
                    self._holding -= 1
            self.lock.release()

    def _get_in(self) -> None:
        """Take a ticket and wait for the lock until no step runs or starts after it; the
        lock is held on return. Settled either way (in, or raised), so no step waits for
        it after."""
        with self._cond:
            ticket = self._asked
            self._asked += 1
        try:
            while True:
                with self._cond:
                    while self._shut(ticket):
                        self._cond.wait()
                self.lock.acquire()
                with self._cond:
                    if not self._shut(ticket):  # in: counted while the lock is held, so the
                        self._settled += 1      # step that waited for it waits for the hold
                        self._holding += 1
                        self._cond.notify_all()
                        return
                self.lock.release()             # a step began meanwhile: let it run
        except BaseException:
            with self._cond:                    # never in: the steps stop waiting for it
                self._settled += 1
                self._cond.notify_all()
            raise


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
        self.slot_max_ms = 0.0            # the longest one slice of it (a step's own wait)
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
        self.slot_max_ms = max(self.slot_max_ms, ms)
        self.credit_ms -= ms
