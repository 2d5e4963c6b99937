"""The in-process host interface: a serving engine tells the shadow what happens, and the
shadow reads in the idle window and in its ration between the host's decode rounds.

    host = Host(reader, host_busy=engine.has_work)      # host_busy: a request runs or waits
    host.start_idle_loop()               # a thread polling every poll_s and at a finish
    host.turn_started(session, prompt_ids)              # a new request's whole prompt
    host.output(session, new_ids)                       # the first call marks the first token
    host.between_rounds(session)                        # on the host's thread, between rounds
    host.turn_finished(session)

One lock serialises the reader between the host's thread and the idle loop, so nothing of the
shadow runs beside the host's decode; the device is synchronised before and after each slice.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from shadow_plugin.reader.reader import FeedResult, Reader
from shadow_plugin.scheduling.scheduler import CostModel, Scheduler, SchedulerConfig, Slice

log = logging.getLogger(__name__)

FINISH_RETRY_S = 0.01         # re-poll period after a finish the host still reports busy
DEFAULT_MS_PER_1K = 100.0     # eager read rate measured on the H200 (BENCHMARKS.md) until learnt


def sync(adapter) -> None:
    """Wait for the reader's device (a ration slice is synchronised before and after). A
    module-level function so that tests can stand in a clocked sync for the host's alone."""
    adapter.sync()


class _Port:
    """The reader as the scheduler's ReaderPort."""

    def __init__(self, reader: Reader, on_question: Callable[[str, int], None]):
        self.reader, self.on_question = reader, on_question

    def backlog(self, session: str) -> int:
        """0 for a session the reader no longer holds. Neither this nor `committed` restores
        a parked session (the scheduler asks on every round); reading one does."""
        try:
            n, c = self.reader.position(session)
        except KeyError:
            return 0
        return n - c

    def committed(self, session: str) -> int:
        try:
            return self.reader.position(session)[1]
        except KeyError:
            return 0

    def read_chunk(self, session: str) -> float:
        return self.reader.read(session, max_chunks=1).ms

    def read_chunks(self, sessions: list[str]) -> tuple[float, list[str]]:
        """One chunk of each in one forward (Reader.read_batch): (ms, the sessions read)."""
        result = self.reader.read_batch(sessions)
        return result.ms, list(result.sessions)

    def answer(self, session: str, at: int) -> None:
        self.on_question(session, at)

    def make_tail(self, sessions: list[str]) -> float | None:
        """Reader.make_tail for the first session of `sessions` (most recent first; as many
        as the reader keeps tails) that has one due: its ms, None when none had."""
        for session in sessions[:self.reader.tails.max_tails]:
            t0 = time.perf_counter()
            try:
                made = self.reader.make_tail(session)
            except KeyError:                       # dropped meanwhile
                continue
            if made:
                return (time.perf_counter() - t0) * 1e3
        return None


class Host:
    """Args: reader; host_busy (callable: True while a host request runs or waits, or a lock
    forbids the GPU); cfg (SchedulerConfig, default from SHADOW_* variables); clock (seconds);
    on_question(session, at): called when a question registered with `question_at` is due;
    idle_hook(): more idle-window work (e.g. the narrator), run by the idle loop after a burst
    while the host stays idle."""

    def __init__(self, reader: Reader, host_busy: Callable[[], bool] = lambda: False,
                 cfg: SchedulerConfig | None = None, clock: Callable[[], float] = time.monotonic,
                 on_question: Callable[[str, int], None] | None = None,
                 idle_hook: Callable[[], object] | None = None):
        cfg = cfg or SchedulerConfig.from_env(grid=reader.config.grid)
        self.reader = reader
        self.lock = threading.RLock()
        port = _Port(reader, on_question or (lambda s, at: None))
        self.scheduler = Scheduler(cfg, port, clock, host_busy,
                                   CostModel(DEFAULT_MS_PER_1K, reader.config.grid),
                                   lock=self.lock)
        self.idle_hook = idle_hook
        self.config = cfg                 # the scheduler's (SchedulerConfig), frozen
        self.num_chunks = {"ration": 0, "idle": 0}   # chunks read in each window, since start
        # what the ration slices that read waited in their first device sync: the host's
        # device work queued before the slice (ms, summed; an engine's slot diagnostics)
        self.slice_sync_ms = 0.0
        self._stop = threading.Event()
        self._wake = threading.Event()            # set: the idle loop polls now
        self._thread: threading.Thread | None = None

    def turn_started(self, session: str, prompt_ids, profile: str | None = None,
                     router_label: str | None = None) -> FeedResult:
        """A new turn: its whole prompt as served. `profile` and `router_label` are the host's
        (the HTTP service acts on them); raises as Reader.feed (nothing changes)."""
        with self.lock:
            result = self.reader.feed(session, prompt_ids, "prompt")
            self.scheduler.turn_started(session)
            return result

    def output(self, session: str, new_ids) -> FeedResult:
        """Ids the host produced since its last call; the first call marks the first token."""
        with self.lock:
            result = self.reader.feed(session, new_ids, "output")
            self.scheduler.output(session)
            return result

    def between_rounds(self, session: str) -> Slice:
        """The shadow's ration slice, on the host's thread, between two decode rounds. When no
        chunk fits the ration (most rounds) it returns at once, without touching the device;
        else the device is synchronised before and after, and the slice's whole wall time
        (chunks, syncs, bookkeeping) counts against the turn's ration."""
        with self.lock:
            stop = self.scheduler.slice_stop(session)
            if stop is not None:
                return Slice("ration", (), 0.0, stop)
            clock = self.scheduler.clock
            t0 = clock()
            # the whole device: also what the shadow's other threads queued on their stream
            # (the legacy default; this thread's is the host's): block_store.spill's copies
            # off a page the slice's chunks may write again, a restore's copies
            sync(self.reader.adapter)
            self.slice_sync_ms += (clock() - t0) * 1e3     # the host's queued device work
            out = self.scheduler.between_rounds(session)
            sync(self.reader.adapter)
            wall_ms = (clock() - t0) * 1e3
            self.scheduler.charge(session, wall_ms - out.ms)
            self._count(out)
            return Slice(out.kind, out.chunks, max(out.ms, wall_ms), out.stop)

    def turn_finished(self, session: str) -> bool:
        """The turn ended: the session's manifest is written (Reader.save, with a disk); the
        idle loop polls at once when it was the last open turn (SchedulerConfig.idle_at_finish)
        instead of at its next poll. Returns whether the manifest holding all the session's
        ids is on disk (False without a disk, or when the write failed)."""
        with self.lock:
            saved = self.reader.knows(session) and self.reader.save(session)
            if self.scheduler.turn_finished(session):
                self._wake.set()
            return saved

    def question_at(self, session: str, at: int) -> None:
        """Register a question at position `at`; on_question fires when C reaches its line."""
        with self.lock:
            self.scheduler.add_question(session, at)

    def forget(self, session: str) -> None:
        """Drop the session from the reader and the scheduler (DELETE)."""
        with self.lock:
            self.scheduler.forget(session)
            try:
                known = self.reader.knows(session)
            except ValueError:                 # not a session id: nothing can be held under it
                known = False
            if known or self.reader.refused(session) is not None:
                self.reader.drop(session)

    def idle_once(self, stop: Callable[[], bool] = lambda: False) -> Slice | None:
        """One poll of the idle window (what the loop runs every poll_s); the lock is held for
        each chunk, not the burst, so host events wait at most one chunk; `stop()` true before
        a chunk ends the burst (the loop passes its stop, so stopping waits one chunk)."""
        out = self.scheduler.idle_burst(stop)
        if out is not None:
            with self.lock:
                self._count(out)
        return out

    def _count(self, out: Slice) -> None:
        self.num_chunks[out.kind] = self.num_chunks.get(out.kind, 0) + sum(
            n for _, n in out.chunks)

    def start_idle_loop(self) -> None:
        """Poll the idle window every poll_s on a daemon thread until `stop_idle_loop`."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="shadow-idle", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        self.reader.adapter.bind_thread()
        while not self._stop.is_set():
            woken = self._wake.wait(self.scheduler.cfg.poll_s)   # a poll, or a turn's finish
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                if self.idle_once(self._stop.is_set) is None and woken:
                    self._follow_finish()
                if self.idle_hook is not None:
                    with self.lock:
                        if not self.scheduler.turns and not self.scheduler.host_busy():
                            self.idle_hook()
            except Exception:                # the loop must outlive one bad poll
                log.exception("idle window poll failed; the loop goes on")

    def _follow_finish(self) -> None:
        """A turn finished while the host still said busy (an engine that counts the
        finishing request, or a service told `busy: false` after `end`): poll every
        FINISH_RETRY_S until the window opens, a new turn starts, or a poll period passed."""
        deadline = time.monotonic() + self.scheduler.cfg.poll_s
        while time.monotonic() < deadline and not self._stop.wait(FINISH_RETRY_S):
            if self.scheduler.turns or self.idle_once(self._stop.is_set) is not None:
                return

    def stop_idle_loop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
