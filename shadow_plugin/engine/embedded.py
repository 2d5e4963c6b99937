"""The shadow inside a serving engine's process (vLLM's worker, rank 0): the service (model,
reader, host interface and facade: server.service.Service), the engine's request events, the
in-turn ration in the per-step slot, the idle window, questions from the engine's API process,
and a planned stop that writes the sessions (docs/vllm.md).

The engine tells it when each step begins and ends, and gives it the slot between (StepInfo).
The shadow works only between steps or in the slot (turnstile.Turnstile): a step's start waits
at most for the shadow's work in flight, one chunk or one event batch or one question forward.
- `begin_step` queues the step's events; a thread applies them between steps, in order (a
  prompt for a session parked on disk is restored there, not on the engine's thread).
- `step_slot` (after the host's forward): one ration slice, within each turn's ration and the
  engine's share (turnstile.StepBudget).
- `end_step`: the host stays busy for the idle window while the engine has requests.
- `call`: a question from the API process is queued for a question thread (it reads what it
  needs chunk by chunk between steps) and answered by ticket, so the engine's loop, which runs
  the call, never waits on it; light calls (status, positions) run at once, and so does an
  ask's position (its 404 / 400 without a ticket). A question that
  names a `reply_to` (server.result_box) has its reply pushed there when it is ready.
The model loads at `start`, in a thread: at the first call from the API process or the first
step, whichever comes first, both after the engine's own warm-up and graph captures (vLLM's
API server starts once its engine is up); events that come before it is ready wait.
"""
from __future__ import annotations

import concurrent.futures
import functools
import itertools
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from shadow_plugin.engine.allocator import AllocatorCounters
from shadow_plugin.engine.follow import START, Follower, RequestEvent
from shadow_plugin.engine.gc_pauses import GcPauses
from shadow_plugin.engine.turnstile import StepBudget, Turnstile
from shadow_plugin.server.config import ServiceConfig
from shadow_plugin.server.remote import TICKETED, serve_call
from shadow_plugin.server.result_box import LOOK, push, reachable
from shadow_plugin.server.service import Service

log = logging.getLogger(__name__)
MAX_JOBS = 1000                               # tickets kept for their results at most
METRICS_MAX_AGE_S = 5.0                       # the oldest sampler's take a metrics call hands
#                                               out (2 sampling intervals, at most this)
RESULT_WAIT_MAX_S = 0.02                      # the longest a `result` call holds the engine's
#                                               loop (only while the host has no requests)
START_WAIT_S = 0.1                            # the longest a step's start waits for a queued
#                                               turn's prompt to be applied (_hand_off_prompts)


def plain_mode(fn):
    """Run `fn` with torch's inference mode off: an engine runs its step under inference mode,
    and tensors the shadow made there (KV buffers grown in the per-step slot) could then not be
    updated by its other threads, which run outside it."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with torch.inference_mode(False):
            return fn(*args, **kwargs)
    return run


@dataclass(frozen=True)
class StepInfo:
    """events: the request events since the last step, in order; running: the ids of the
    requests the step runs; has_requests: requests remain (running or waiting) after it."""

    events: tuple[RequestEvent, ...] = ()
    running: tuple[str, ...] = ()
    has_requests: bool = False


class EmbeddedShadow:
    """Args: cfg (the service's settings: ServiceConfig.from_env and the connector's); host:
    what the engine runs (its version, model runner, CUDA-graph mode...), shown in status."""

    def __init__(self, cfg: ServiceConfig, host: dict | None = None):
        self.cfg = cfg
        self.host = dict(host or {})
        self.gc_pauses = GcPauses()            # the process's collections (a stall's cause?)
        self.allocator = AllocatorCounters()      # ... and the CUDA allocator's device calls
        self.service = Service(cfg, gc_ms=lambda: self.gc_pauses.total_ms)
        self.budget = StepBudget(cfg.scheduler.share, burst_ms=cfg.scheduler.slice_ms)
        self.turnstile: Turnstile | None = None
        self._follower: Follower | None = None
        self._events: deque = deque()
        self._wake = threading.Condition()     # _events, _queued, _applied, _start_due
        self._queued = self._applied = 0
        self._start_due = 0                    # _applied that the last queued prompt needs
        self._prefetching = False              # the events thread reads pages ahead (_prefetch)
        self.start_wait_ms = 0.0               # steps' starts waiting for prompts (summed)
        self.gate_wait_ms = 0.0                # ... for the shadow's holds (summed)
        self.gate_wait_max_ms = 0.0            # ... the longest one step's start waited
        self.gate_wait_max_let_in_ms = 0.0     # ... of it, until the holds asked before it
        self.gate_wait_max_behind_hold = False  # ... its rest a hold (else the idle chunk)
        self.gate_wait_max_gc_ms = 0.0         # ... the process's collections meanwhile
        self._jobs: dict[int, concurrent.futures.Future] = {}
        self._tickets = itertools.count(1)
        self._questions = concurrent.futures.ThreadPoolExecutor(1, "shadow-questions")
        self._events_thread = threading.Thread(target=self._events_loop, name="shadow-events",
                                               daemon=True)
        self._closed = False

    def start(self) -> None:
        """Load the model in a thread (once), then apply what queued meanwhile."""
        if self._events_thread.ident is None and not self._closed:
            self.gc_pauses.install()           # timed from here until close
            self.service.start()
            self._events_thread.start()

    # -- events ---------------------------------------------------------------------------------
    @plain_mode
    def _events_loop(self) -> None:
        if self.service.wait_loaded() != "ready":
            with self._wake:
                self._events.clear()          # no model: nothing will follow them
                self._wake.notify_all()
            return
        shadow = self.service.shadow
        # the shadow's startup heap (model, compiled kernels, CUDA graphs) frozen, as vLLM froze
        # its own before the shadow loaded: full collections then skip it (gc_pauses.py)
        log.info("shadow: %d objects frozen after the warm-up", self.gc_pauses.freeze_heap())
        self.allocator.mark(shadow.reader.adapter.model.device)    # serving from here
        shadow.reader.adapter.bind_thread()
        try:
            self._questions.submit(shadow.reader.adapter.bind_thread)
        except RuntimeError:                   # closed meanwhile: no question will run; the
            pass                               # events queued before the stop still apply
        self.turnstile = Turnstile(shadow.lock, gc_ms=lambda: self.gc_pauses.total_ms)
        shadow.gate = self.turnstile           # questions read between steps only
        self._follower = Follower(shadow, self.cfg.grid)
        while True:
            with self._wake:
                while not self._events and not self._closed:
                    self._wake.wait()
                if not self._events:           # closed, and every event applied
                    return
                batch = list(self._events)
                self._events.clear()
            self._apply(batch)
            with self._wake:
                self._applied += len(batch)
                self._wake.notify_all()

    def _apply(self, batch: list[RequestEvent]) -> None:
        """Apply one batch of events between steps; a batch that fails is logged and skipped:
        the thread must outlive it, or the events after it would never be applied, and every
        later step's start would wait START_WAIT_S for a prompt (_hand_off_prompts)."""
        self._prefetch(batch)
        try:
            with self.turnstile("events"):
                self._follower.apply(batch)
        except ValueError as e:                # bad events (Follower.apply): the others ran
            log.warning("shadow: request events skipped: %s", e)
        except Exception:                      # a restore that failed, a bug: the batch's rest
            log.exception("shadow: a batch of request events failed; the thread goes on")

    def _prefetch(self, batch: list[RequestEvent]) -> None:
        """Before the batch's hold: the page files of the named sessions its prompts start
        read ahead (ShadowReader.prefetch: a parked session's restore then only copies rows
        into the pool under the hold, where it read and hashed them, 140-177 ms at 100k on
        the H200). Meanwhile a step's start does not wait for these prompts
        (_hand_off_prompts): they are applied at a later step's start."""
        named = [(ev.session, ev.ids) for ev in batch if ev.kind == START and ev.session]
        try:
            for session, ids in named:
                self.service.shadow.prefetch(session, ids, self._reading_ahead)
        except Exception:                      # a read-ahead: the restore reads what it lacks
            log.exception("shadow: reading a parked session's pages ahead failed")
        finally:
            with self._wake:
                self._prefetching = False

    def _reading_ahead(self) -> None:
        """_prefetch's files are about to be read: a step's start waiting for the batch's
        prompts stops waiting (_hand_off_prompts)."""
        with self._wake:
            self._prefetching = True
            self._wake.notify_all()

    # -- the engine's step ----------------------------------------------------------------------
    def begin_step(self, info: StepInfo) -> None:
        if self._closed:
            return
        self.start()
        self.service.busy = True              # the idle window starts no chunk now
        self.budget.step_begins()
        if self.turnstile is not None:
            self._hand_off_prompts()
            t0, gc0 = time.perf_counter(), self.gc_pauses.total_ms
            let_in_ms, behind_hold = self.turnstile.step_begins()   # the work in flight
            waited_ms = (time.perf_counter() - t0) * 1e3
            self.gate_wait_ms += waited_ms
            if waited_ms > self.gate_wait_max_ms:
                self.gate_wait_max_ms, self.gate_wait_max_let_in_ms = waited_ms, let_in_ms
                self.gate_wait_max_behind_hold = behind_hold
                self.gate_wait_max_gc_ms = self.gc_pauses.total_ms - gc0
        if info.events and self.service.state != "failed":
            with self._wake:
                self._events.extend(info.events)
                self._queued += len(info.events)
                if any(ev.kind == START for ev in info.events):
                    self._start_due = self._queued
                self._wake.notify_all()

    def _hand_off_prompts(self) -> None:
        """A turn's prompt queued at an earlier step and not applied yet: wait (at most
        START_WAIT_S) until the events thread has applied it, before the step closes the
        turnstile. The engine's thread waits, so the events thread has the GIL and the
        turnstile: on a GPU the host holds the GIL through its steps, and a woken events
        thread could wait many steps for it (tests/unit/test_follow.py), while the turn it
        was to follow went unread in its ration. Costs the step one prompt's apply
        (Follower.apply: Reader.feed's hashing and page lookups), once a request; summed in
        start_wait_ms. Not while the events thread reads a parked session's pages ahead
        (_prefetch): the step would wait for the disk. The turnstile is open meanwhile, so a
        question thread may take more than its one hold then; bounded by START_WAIT_S, and
        only while a prompt waits."""
        with self._wake:
            if self._applied >= self._start_due or self._prefetching:
                return
            t0 = time.perf_counter()
            while self._applied < self._start_due and not self._prefetching and \
                    self.service.state != "failed":
                left = START_WAIT_S - (time.perf_counter() - t0)
                if left <= 0:
                    break
                self._wake.wait(left)
            self.start_wait_ms += (time.perf_counter() - t0) * 1e3

    def wait_applied(self, timeout_s: float | None = None) -> bool:
        """Wait until every event queued so far is applied (or the model failed to load);
        True when they are."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._wake:
            target = self._queued
            while self._applied < target and self.service.state != "failed":
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._wake.wait(0.05 if left is None else min(left, 0.05))
            return self._applied >= target

    @plain_mode
    def step_slot(self, info: StepInfo) -> None:
        """One ration slice of a session whose request ran this step (StepBudget)."""
        follower = self._follower
        if self._closed or follower is None:
            return
        sessions = [s for s in (follower.sessions.get(r) for r in info.running) if s]
        session = self.budget.next_session(sessions)
        if session is None:
            return
        t0 = time.perf_counter()
        try:
            self.service.shadow.between_rounds(session)
        except KeyError:                       # deleted meanwhile
            pass
        self.budget.charge((time.perf_counter() - t0) * 1e3)

    def end_step(self, info: StepInfo) -> None:
        if self._closed:
            return
        self.budget.step_ends()
        self.service.busy = info.has_requests
        if self.turnstile is not None:
            self.turnstile.step_ends()

    # -- calls from the API process, and the stop -----------------------------------------------
    @plain_mode
    def call(self, name: str, kwargs: dict):
        """A call from the engine's API process: server.remote.serve_call's reply, or for a
        question ("ticket", n), whose reply `result` gives later (("pending", waited) until
        then); "stop" is `close` (the front end calls it when a planned stop begins). The first
        call (the endpoint plugin's, once vLLM's API server is up) starts the model's load."""
        if not self._closed:
            self.start()
        if name == "stop":
            self.close()
            return ("ok", None)
        if name == "result":
            return self._result(kwargs.get("ticket"), kwargs.get("wait_s"))
        if name == "metrics":
            # the history sampler's last take (its own thread, every history_every_s): this
            # call runs on the engine's thread between the host's steps, every second from
            # the API process, and would otherwise wait there for the shadow's lock (held
            # through a question's step or a chunk) and build the stats itself
            snap = self.service.metrics_snapshot(min(2 * self.cfg.history_every_s,
                                                     METRICS_MAX_AGE_S))
            if snap is not None:
                return ("ok", snap)
        if name in TICKETED:          # by ticket, in the question thread
            kwargs = dict(kwargs)
            if name in ("ask", "ask_many") and kwargs.get("fork_at") is None:
                # the position at once, as a light call: an unknown session (404), an `at`
                # past its ids (400) or a loading model (503) is answered now, never behind
                # the question in the thread (a summary, a check: seconds)
                reply = serve_call(self.service, "fork_position",
                                   {"session": kwargs.get("session"), "at": kwargs.get("at")})
                if reply[0] != "ok":
                    return reply
                kwargs["fork_at"] = reply[1]
            return self._submit(name, kwargs, kwargs.pop("reply_to", None))
        return serve_call(self.service, name, kwargs,
                          self._status_extra() if name == "status" else None)

    def _status_extra(self) -> dict:
        """What status adds inside an engine: this process, the step discipline's state, the
        requests being followed."""
        follower = self._follower
        return {"pid": os.getpid(), "embedded": True, "host": self.host,
                "stepping": bool(self.turnstile and self.turnstile.stepping),
                "engine_share": {"slot_ms": self.budget.slot_ms,
                                 "slot_max_ms": self.budget.slot_max_ms,
                                 "steps_ms": self.budget.steps_ms,
                                 "credit_ms": self.budget.credit_ms, **self._slot_parts()},
                "followed_requests": dict(follower.sessions) if follower else {}}

    def _slot_parts(self) -> dict:
        """Where the slot's time and the steps' waits went (ms, summed since start unless the
        name says max; each field in docs/vllm.md, "Where the host's time went"):
        - the slot's: lock_wait_ms, sync_wait_ms, slice_overhead_ms (0 before the model is
          up; slice_overhead_ms read on the engine's thread, the one that charges it);
        - the steps' starts: start_wait_ms (the prompt hand-off), gate_wait_ms (the
          turnstile), gate_wait_max_ms (the longest one: the host's longest stall on the
          shadow between its steps) with its gate_wait_max_let_in_ms,
          gate_wait_max_behind_hold and gate_wait_max_gc_ms (the collections during it);
        - the longest hold through the turnstile (Turnstile): gate_hold_max_ms, _kind,
          _cpu_ms, _gc_ms;
        - the process's garbage collections (GcPauses.stats), serving and the start's;
        - the CUDA allocator's device calls during serving (AllocatorCounters.stats)."""
        ts = self.turnstile or Turnstile(threading.RLock())   # none yet: no hold, zeros
        waits = {"start_wait_ms": self.start_wait_ms, "gate_wait_ms": self.gate_wait_ms,
                 "gate_wait_max_ms": self.gate_wait_max_ms,
                 "gate_wait_max_let_in_ms": self.gate_wait_max_let_in_ms,
                 "gate_wait_max_behind_hold": self.gate_wait_max_behind_hold,
                 "gate_wait_max_gc_ms": self.gate_wait_max_gc_ms,
                 "gate_hold_max_ms": ts.hold_max_ms, "gate_hold_max_kind": ts.hold_max_kind,
                 "gate_hold_max_cpu_ms": ts.hold_max_cpu_ms,
                 "gate_hold_max_gc_ms": ts.hold_max_gc_ms, **self.gc_pauses.stats(),
                 **self.allocator.stats()}
        shadow = self.service.shadow if self.service.state == "ready" else None
        if shadow is None:
            return {"lock_wait_ms": 0.0, "sync_wait_ms": 0.0, "slice_overhead_ms": 0.0,
                    **waits}
        return {**waits,
                "lock_wait_ms": shadow.slot_lock_wait_ms,
                "sync_wait_ms": shadow.host.slice_sync_ms,
                "slice_overhead_ms": shadow.host.scheduler.slice_overhead_ms()}

    def _submit(self, name: str, kwargs: dict, reply_to=None):
        """Queue the question; ("ticket", n, pushed): with a reply_to that this process can
        reach (result_box.reachable; not a door on another node) its reply is also pushed
        there when ready (result_box.push) and `pushed` is True; the ticket keeps it for a
        look either way."""
        ticket = next(self._tickets)
        # looked at before the question starts: once it runs, its thread contends for the GIL
        # with this one, the engine's
        pushed = reply_to is not None and reachable(reply_to)
        job = self._jobs[ticket] = self._questions.submit(
            plain_mode(serve_call), self.service, name, kwargs)
        if pushed:
            job.add_done_callback(functools.partial(_push_reply, reply_to))
        if len(self._jobs) > MAX_JOBS:         # results nobody fetched (clients gone)
            for old in [t for t, f in self._jobs.items() if f.done()][:len(self._jobs) - MAX_JOBS]:
                del self._jobs[old]
        return ("ticket", ticket, pushed)

    def _result(self, ticket, wait_s=None):
        """The question's reply, or ("pending", waited): while the host has no requests the
        engine's loop (which runs this call) waits up to wait_s (s, a number; at most
        RESULT_WAIT_MAX_S) for it, so the API process need not poll again and again; never
        while the host has requests (their steps come first), and never for a question still
        queued behind another in the question thread (it cannot end within the wait; each
        such look would hold the loop, and a new host request behind it, for nothing)."""
        job = self._jobs.get(ticket)
        if job is None:
            return ("error", "KeyError", (f"no question with ticket {ticket!r}",))
        waited = False
        if not job.done() and job.running() and isinstance(wait_s, (int, float)) \
                and wait_s > 0 and not self.service.busy:
            concurrent.futures.wait([job], timeout=min(wait_s, RESULT_WAIT_MAX_S))
            waited = True
        if not job.done():
            return ("pending", waited)
        del self._jobs[ticket]
        return job.result()

    def close(self) -> None:
        """A planned stop: stop following, stop the idle loop, write every resident session
        (with SHADOW_DISK set). Runs once; the step hooks do nothing after it."""
        if self._closed:
            return
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        self.gc_pauses.remove()
        if self.turnstile is not None:
            self.turnstile.step_ends()        # a question waiting for a step's end goes on
        self._questions.shutdown(wait=False, cancel_futures=True)
        if self.service.wait_loaded(120) == "ready":
            self._events_thread.join(120)      # the events queued before the stop, applied
            with torch.inference_mode(False):
                self.service.close()
            stats = self.service.reader.stats()
            log.warning("shadow: stopped; %d sessions on disk in %s", sum(
                s["residency"] == "disk" for s in stats["sessions"].values()),
                self.cfg.disk_dir or "(no SHADOW_DISK: none written)")


def _push_reply(reply_to, job: concurrent.futures.Future) -> None:
    """A done question's reply to the door's box; LOOK instead for a failure, a cancelled
    question or a reply that cannot be pushed (too large...), so that the door looks at once
    (its look raises the failure there, or fetches the reply)."""
    if job.cancelled() or job.exception() is not None or not push(reply_to, job.result()):
        push(reply_to, LOOK)
