"""shadow_plugin.engine.turnstile: the turnstile between a serving engine's steps (the shadow's
threads, request events and questions, get in between two steps even when the host's thread
steps back to back and holds the GIL through each step: vLLM on a GPU, about 4 ms a decode step
of launches and Python, a few microseconds between steps; and never while a step runs), and
the per-step slot's engine-wide share (StepBudget)."""
import threading
import time

import pytest

from shadow_plugin.engine.turnstile import StepBudget, Turnstile
from shadow_plugin.scheduling.sched_types import VirtualClock


def _spin(s: float) -> None:
    """Busy for s seconds in Python, holding the GIL (as the host's thread does in a step)."""
    end = time.perf_counter() + s
    while time.perf_counter() < end:
        pass


class _Host:
    """A host thread stepping back to back: step_begins, `step_s` of Python, step_ends."""

    def __init__(self, ts: Turnstile, step_s: float = 0.002):
        self.ts, self.step_s = ts, step_s
        self.steps = 0
        self.in_step = False
        self.overlaps = 0            # shadow holds that saw a step running
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.ts.step_begins()
            self.in_step = True
            _spin(self.step_s)
            self.in_step = False
            self.steps += 1
            self.ts.step_ends()

    def __enter__(self):
        self.thread.start()
        while self.steps < 3:
            time.sleep(0.001)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)


def test_a_shadow_thread_gets_in_between_back_to_back_steps_that_hold_the_gil():
    """Each of 20 holds asked for while the host steps back to back gets in within two steps
    of asking, between steps (never while one runs); the host keeps stepping."""
    ts = Turnstile(threading.RLock())
    waits = []
    with _Host(ts) as host:
        for _ in range(20):
            asked = host.steps
            with ts():
                if host.in_step:
                    host.overlaps += 1
                waits.append(host.steps - asked)
                _spin(0.0005)                     # the hold's work: an event batch
        stepped = host.steps
    assert host.overlaps == 0
    assert max(waits) <= 2, waits
    assert stepped >= 20


def test_the_host_waits_for_a_hold_in_flight_and_admits_only_those_that_asked_before_it():
    """A hold that got in finishes before the next step starts (the step waits for it); a
    shadow thread that asks again at once does not hold the host off for more than one hold
    a step."""
    ts = Turnstile(threading.RLock())
    holds, stop = [], threading.Event()

    def greedy() -> None:                          # asks again as soon as it is out
        while not stop.is_set():
            with ts():
                holds.append(host.steps)
                _spin(0.001)

    with _Host(ts) as host:
        t = threading.Thread(target=greedy, daemon=True)
        t.start()
        time.sleep(0.3)
        stop.set()
        t.join(5)
        steps = host.steps
    # at most one hold between two steps (the greedy thread's next ask waits for the next gap)
    per_gap = {}
    for s in holds:
        per_gap[s] = per_gap.get(s, 0) + 1
    assert holds and max(per_gap.values()) == 1, per_gap
    assert steps >= len(holds) - 1


def test_the_engine_wide_share_keeps_at_most_one_slice_of_unspent_credit():
    """StepBudget is a token bucket: an hour of steps with nothing for the shadow to read
    leaves it one slice of credit (burst_ms), not 72 s, so the turns that follow get the
    share of their own steps; below 0 credit (a slice over it) no slot runs until the
    steps repaid it."""
    clock = VirtualClock()
    budget = StepBudget(0.02, clock, burst_ms=150.0)
    assert budget.next_session(["a"]) is None                # no step yet: no credit

    def step(s: float) -> None:
        budget.step_begins()
        clock.t += s
        budget.step_ends()
    for _ in range(3600):                                     # an hour of 1-s steps, no slot
        step(1.0)
    assert budget.credit_ms == 150.0 and budget.steps_ms == pytest.approx(3.6e6)
    taken = 0.0
    for _ in range(1000):                                     # 10 s of 10-ms steps, eager slots
        step(0.01)
        if budget.next_session(["a", "b"]) is not None:
            budget.charge(40.0)                               # a slice of 40 ms a time
            taken += 40.0
    assert taken <= 0.02 * 10_000 + 150.0 + 40.0             # the share, the burst, one slice
    assert taken >= 0.02 * 10_000                             # and no less than the share
    assert budget.slot_max_ms == 40.0                         # the longest one slice
    budget.charge(500.0)                                      # a slice far over the credit
    assert budget.slot_max_ms == 500.0 and budget.slot_ms == pytest.approx(taken + 500.0)
    owed_ms = -budget.credit_ms
    assert owed_ms >= 500.0 - 150.0 and budget.next_session(["a"]) is None
    step(owed_ms / 0.02 / 1e3 - 0.5)                          # not yet repaid: still none
    assert budget.next_session(["a"]) is None
    step(1.0)                                                 # repaid, 10 ms over: a slot
    assert budget.next_session(["a"]) is not None and budget.credit_ms == pytest.approx(10.0)


def test_a_hold_nested_in_the_same_threads_hold_does_not_wait_for_a_step_that_waits_for_it():
    """A thread inside a hold that asks again (a nested `with turnstile():`) while a step
    starts: the step waits for the outer hold, so the inner one must not wait for the step
    (it did, for its ticket was asked after the step's start: both threads hung for good); it
    re-enters the lock at once, and the step runs once the outer hold ends."""
    ts = Turnstile(threading.RLock())
    inside, nested, order = threading.Event(), threading.Event(), []

    def shadow_thread() -> None:
        with ts():
            inside.set()
            nested.wait(5)
            with ts():
                order.append("inner")
            order.append("outer")

    t = threading.Thread(target=shadow_thread, daemon=True)
    t.start()
    assert inside.wait(5)
    host = threading.Thread(target=lambda: (ts.step_begins(), order.append("step")), daemon=True)
    host.start()
    time.sleep(0.05)                               # the step's start waits for the hold
    nested.set()
    t.join(3)
    host.join(3)
    assert not t.is_alive() and not host.is_alive()
    assert order == ["inner", "outer", "step"]
    ts.step_ends()
    assert ts._asked == ts._settled == 1           # the nested hold took no ticket


def test_failed_holds_leave_the_tickets_balanced():
    """A hold whose body raises, and one whose lock.acquire raises, are settled: the next
    step's start waits for nobody (not max_wait_s)."""
    class FlakyLock:
        def __init__(self):
            self.lock, self.failures = threading.RLock(), 0

        def acquire(self):
            if self.failures:
                self.failures -= 1
                raise RuntimeError("acquire failed")
            return self.lock.acquire()

        def release(self):
            self.lock.release()

        def __enter__(self):
            self.acquire()

        def __exit__(self, *exc):
            self.release()

    lock = FlakyLock()
    ts = Turnstile(lock)
    with pytest.raises(KeyError):
        with ts():
            raise KeyError("body")
    lock.failures = 1
    with pytest.raises(RuntimeError):
        with ts():
            pass
    t0 = time.perf_counter()
    ts.step_begins()
    assert time.perf_counter() - t0 < 0.1 and ts._asked == ts._settled == 2
    ts.step_ends()


def test_a_step_start_with_no_end_before_it_still_lets_a_waiting_hold_in():
    """An engine that starts a step twice (no end between) is between steps at the second
    start: a hold that asked meanwhile gets in there, not after the 1-s bound."""
    ts = Turnstile(threading.RLock())
    ts.step_begins()                                  # a step, never ended
    entered = threading.Event()

    def hold() -> None:
        with ts():
            entered.set()
    t = threading.Thread(target=hold, daemon=True)
    t.start()
    time.sleep(0.05)                                  # it asked, and waits for the step
    assert not entered.is_set()
    t0 = time.monotonic()
    ts.step_begins()                                  # the next start: it gets in first
    assert entered.is_set() and time.monotonic() - t0 < 0.5
    ts.step_ends()
    t.join(5)


def test_the_longest_hold_is_kept():
    """hold_max_ms: the longest outer hold, from in to out (a nested hold is inside it)."""
    ts = Turnstile(threading.RLock())
    assert ts.hold_max_ms == 0.0
    with ts():
        time.sleep(0.03)
        with ts():
            time.sleep(0.01)
    with ts():
        pass
    assert 40 <= ts.hold_max_ms < 1000 and ts.hold_max_kind == "route"
    with ts("events"):
        time.sleep(0.06)
    assert 60 <= ts.hold_max_ms < 1000 and ts.hold_max_kind == "events"
    assert 0 <= ts.hold_max_cpu_ms < 30              # it slept: waited, computed little
    with ts("events"):
        t = time.thread_time()
        while time.thread_time() - t < 0.08:         # computes 80 ms of CPU
            pass
    assert ts.hold_max_ms >= 80 and ts.hold_max_cpu_ms >= 75
    assert ts.hold_max_cpu_ms <= ts.hold_max_ms + 1
    with ts("route"):                                # shorter: the longest stays
        pass
    assert ts.hold_max_kind == "events"


def test_the_longest_holds_garbage_collections_are_read_from_the_clock_given():
    """hold_max_gc_ms: the gc_ms clock's advance over the longest hold (GcPauses.total_ms),
    not over a shorter one after it; 0 with no clock."""
    assert Turnstile(threading.RLock()).hold_max_gc_ms == 0.0
    clock = [100.0]
    ts = Turnstile(threading.RLock(), gc_ms=lambda: clock[0])
    with ts("events"):
        time.sleep(0.02)
        clock[0] += 7.5                              # a collection of 7.5 ms inside
    assert ts.hold_max_gc_ms == 7.5
    with ts():
        clock[0] += 50.0                             # a shorter hold: not the longest
    assert ts.hold_max_gc_ms == 7.5 and ts.hold_max_kind == "events"


def _until(cond, timeout_s: float = 5.0) -> None:
    """Wait (polling) until cond() holds."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_a_step_start_tells_the_wait_for_the_holds_let_in_apart():
    """step_begins returns (let_in_ms, behind_hold). A chunk in flight (the idle loop's: the
    lock taken directly) with an event batch asked behind it: let_in_ms is the chunk's rest,
    and the batch's hold comes after, inside the step's wait (behind_hold). The chunk alone:
    let_in_ms about 0, the wait the chunk's, not behind a hold. A hold already in when the
    step begins: let_in_ms about 0, the wait that hold's, behind it."""
    lock = threading.RLock()
    ts = Turnstile(lock)

    def chunk(ms: float, started: threading.Event, ended: list) -> None:
        with lock:
            started.set()
            time.sleep(ms / 1e3)
            ended.append(time.perf_counter())

    def batch(ms: float, started: threading.Event) -> None:    # through the turnstile
        with ts():
            started.set()
            time.sleep(ms / 1e3)

    # a chunk in flight, a batch asked behind it
    chunk_in, batch_in, ended = threading.Event(), threading.Event(), []
    reader = threading.Thread(target=chunk, args=(80, chunk_in, ended), daemon=True)
    reader.start()
    assert chunk_in.wait(5)
    events = threading.Thread(target=batch, args=(50, batch_in), daemon=True)
    events.start()
    _until(lambda: ts._asked == 1)               # it asked, behind the chunk
    t0 = time.perf_counter()
    let_in_ms, behind_hold = ts.step_begins()
    t1 = time.perf_counter()
    ts.step_ends()
    reader.join(5)
    events.join(5)
    assert batch_in.is_set() and behind_hold
    assert let_in_ms >= (ended[0] - t0) * 1e3 - 1   # until the chunk ended, the batch in
    assert (t1 - ended[0]) * 1e3 >= 45             # then the batch's 50-ms hold

    # the chunk alone
    chunk_in, ended = threading.Event(), []
    reader = threading.Thread(target=chunk, args=(60, chunk_in, ended), daemon=True)
    reader.start()
    assert chunk_in.wait(5)
    let_in_ms, behind_hold = ts.step_begins()
    t1 = time.perf_counter()
    ts.step_ends()
    reader.join(5)
    assert let_in_ms < 10 and not behind_hold and t1 >= ended[0]

    # a hold already in
    batch_in = threading.Event()
    events = threading.Thread(target=batch, args=(50, batch_in), daemon=True)
    events.start()
    assert batch_in.wait(5)
    t0 = time.perf_counter()
    let_in_ms, behind_hold = ts.step_begins()
    waited_ms = (time.perf_counter() - t0) * 1e3
    ts.step_ends()
    events.join(5)
    assert let_in_ms < 10 and behind_hold and waited_ms > let_in_ms
    assert ts._holding == 0
