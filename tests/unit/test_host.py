"""The in-process host interface over the real reader (random:tiny) on a virtual clock."""
import time

from helpers import check_refs, rand_ids  # noqa: E402

from shadow_plugin.reader.reader import Reader
from shadow_plugin.scheduling.host import Host
from shadow_plugin.scheduling.scheduler import SchedulerConfig, VirtualClock

G = 64


def _wait_committed(host, num_ids: int, timeout_s: float, step_s: float = 0.01) -> None:
    """Wait until session "s" has num_ids committed, or timeout_s passed (the caller asserts)."""
    deadline = time.monotonic() + timeout_s
    while host.reader.committed("s") < num_ids and time.monotonic() < deadline:
        time.sleep(step_s)


def test_a_turn_read_in_ration_then_idle(tiny):
    clock, busy, due = VirtualClock(), [True], []
    host = Host(Reader(tiny, grid=G), host_busy=lambda: busy[0],
                cfg=SchedulerConfig(grid=G, share=0.5, slice_ms=1e6), clock=clock,
                on_question=lambda s, at: due.append((s, at)))
    prompt = rand_ids(10 * G + 5, 0)
    host.turn_started("s", prompt)
    host.question_at("s", 4 * G + 3)
    assert host.between_rounds("s").chunks == ()        # no first token yet: no ration
    host.output("s", rand_ids(3, 1))
    clock.t = 1000.0                                    # a long decode earns a large ration
    sl = host.between_rounds("s")
    assert sl.kind == "ration" and sl.chunks == (("s", 10),)
    assert due == [("s", 4 * G + 3)]                    # answered at its grid line on the way
    host.output("s", rand_ids(2 * G, 2))
    assert host.idle_once() is None                     # busy, and the turn is open
    host.turn_finished("s")
    busy[0] = False
    assert host.idle_once().chunks == (("s", 2),)
    assert host.reader.backlog("s") < G and host.reader.check_exact("s")


def test_idle_loop_thread_reads_and_stops(tiny):
    host = Host(Reader(tiny, grid=G), cfg=SchedulerConfig(grid=G, poll_s=0.01))
    host.turn_started("s", rand_ids(3 * G, 3))
    host.turn_finished("s")
    host.start_idle_loop()
    _wait_committed(host, 3 * G, 30)
    host.stop_idle_loop()
    assert host.reader.committed("s") == 3 * G and host.reader.check_exact("s")


def test_a_finished_turn_wakes_the_idle_loop_at_once(tiny):
    """With an hour between polls, the loop still reads right after turn_finished (the idle
    window opens at the finish, SchedulerConfig.idle_at_finish); without it, it waits."""
    for at_finish in (True, False):
        cfg = SchedulerConfig(grid=G, poll_s=3600.0, idle_at_finish=at_finish)
        host = Host(Reader(tiny, grid=G), cfg=cfg)
        host.start_idle_loop()
        try:
            host.turn_started("s", rand_ids(2 * G, 4))
            host.turn_finished("s")
            _wait_committed(host, 2 * G, 30 if at_finish else 1)
        finally:
            host.stop_idle_loop()                        # returns at once: the stop wakes it
        assert host.reader.committed("s") == (2 * G if at_finish else 0), at_finish


def test_a_finish_the_host_still_reports_busy_is_followed_up(tiny):
    """The host says busy for 50 ms after turn_finished (its request still counted): the loop
    re-polls after the finish and reads once the host is idle, not an hour later."""
    busy = [True]
    host = Host(Reader(tiny, grid=G), host_busy=lambda: busy[0],
                cfg=SchedulerConfig(grid=G, poll_s=3600.0))
    host.start_idle_loop()
    try:
        host.turn_started("s", rand_ids(2 * G, 5))
        host.turn_finished("s")
        time.sleep(0.05)
        busy[0] = False
        _wait_committed(host, 2 * G, 30)
    finally:
        host.stop_idle_loop()
    assert host.reader.committed("s") == 2 * G


def test_stopping_the_loop_ends_a_burst_before_its_next_chunk(tiny):
    """A 10 s burst over a long backlog: stop_idle_loop returns after the chunk in flight,
    not at the burst's end; the state read so far stays exact."""
    host = Host(Reader(tiny, grid=G), cfg=SchedulerConfig(grid=G, idle_burst_s=10.0))
    host.turn_started("s", rand_ids(400 * G, 6))
    host.turn_finished("s")
    host.start_idle_loop()
    _wait_committed(host, 2 * G, 30, step_s=0.005)
    t0 = time.monotonic()
    host.stop_idle_loop()
    stopped_s = time.monotonic() - t0
    c = host.reader.committed("s")
    assert 2 * G <= c < 400 * G and stopped_s < 2.0, (c, stopped_s)
    assert host.reader.check_exact("s")


def test_the_idle_loop_outlives_a_failing_poll(tiny):
    """A poll that raises is logged; the loop goes on and reads on the next poll."""
    host = Host(Reader(tiny, grid=G), cfg=SchedulerConfig(grid=G, poll_s=0.01))
    real, calls = host.scheduler.idle_burst, []

    def flaky(*args):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return real(*args)

    host.scheduler.idle_burst = flaky
    host.turn_started("s", rand_ids(2 * G, 3))
    host.turn_finished("s")
    host.start_idle_loop()
    try:
        _wait_committed(host, 2 * G, 30)
    finally:
        host.stop_idle_loop()
    assert len(calls) >= 2 and host.reader.committed("s") == 2 * G


def test_forget_drops_the_session_everywhere(tiny):
    host = Host(Reader(tiny, grid=G), cfg=SchedulerConfig(grid=G))
    host.turn_started("s", rand_ids(G, 4))
    host.question_at("s", G)
    host.forget("s")
    assert "s" not in host.reader.sessions() and host.scheduler.recency == []
    assert host.scheduler.turns == {} and host.scheduler.questions == []
    assert host.idle_once().stop == "fresh"


def test_a_round_with_no_chunk_due_is_free_and_a_slice_pays_its_overhead(tiny, monkeypatch):
    """between_rounds returns at once when no chunk fits the ration (no sync, nothing used);
    a slice's wall time beyond its chunks (syncs, bookkeeping) counts against the ration."""
    import shadow_plugin.scheduling.host as host_mod
    clock, syncs = VirtualClock(), []

    def sync(device):                      # a sync that takes 2 ms of the clock
        syncs.append(device)
        clock.t += 0.002
    monkeypatch.setattr(host_mod, "sync", sync)
    host = Host(Reader(tiny, grid=G), host_busy=lambda: True,
                cfg=SchedulerConfig(grid=G, share=0.02, slice_ms=1e6), clock=clock)
    host.turn_started("s", rand_ids(3 * G, 5))
    host.output("s", rand_ids(1, 6))
    clock.t += 0.01                        # 10 ms of decode earn 0.2 ms: no chunk fits
    sl = host.between_rounds("s")
    assert sl.chunks == () and sl.ms == 0.0 and syncs == []
    assert host.scheduler.turns["s"].used_ms == 0.0
    clock.t += 1000.0                      # a long decode earns room for every chunk
    sl = host.between_rounds("s")
    assert sl.chunks == (("s", 3),) and len(syncs) == 2
    used = host.scheduler.turns["s"].used_ms
    assert abs(used - sl.ms) < 1e-6 and sl.ms >= 4.0       # the two syncs' 4 ms counted


def test_the_idle_window_keeps_the_tail_a_question_at_the_end_starts_from(tiny):
    """Once every session is fresh, the idle window forwards the tail of a question at the
    end of the most recent sessions (Reader.make_tail); the question then forwards ids[cut:]
    and its own ids only, with the bits it gets without a kept tail."""
    g = 256
    clock = VirtualClock()
    host = Host(Reader(tiny, grid=g), cfg=SchedulerConfig(grid=g), clock=clock)
    ids = rand_ids(2 * g + 150, 7)
    host.turn_started("s", ids)
    host.turn_finished("s")
    burst = host.idle_once()
    assert burst.chunks == (("s", 2),) and burst.stop == "fresh"
    reader = host.reader
    assert reader.tails.num_made == 1 and len(reader.tails) == 1
    assert host.idle_once().ms == 0.0                      # kept: nothing more to do
    q = rand_ids(20, 8)
    got = reader.ask("s", q, ["y", "n"])
    assert reader.tails.num_hits == 1 and got.num_forwarded_tokens == 150 - 128 + 20
    alone = Reader(tiny, grid=g, max_tails=0)
    alone.feed("s", ids, "prompt")
    alone.read("s")
    assert alone.ask("s", q, ["y", "n"]).probs == got.probs


def test_the_idle_window_passes_over_a_session_dropped_since_its_turn(tiny):
    """A session the reader dropped (its scheduler still lists it) is passed over by the tails
    the idle window makes; the others get theirs, once."""
    g = 128
    host = Host(Reader(tiny, grid=g), cfg=SchedulerConfig(grid=g), clock=VirtualClock())
    for i, s in enumerate("abc"):
        host.turn_started(s, rand_ids(2 * g + 100, i))
        host.turn_finished(s)
    host.reader.drop("c")                                  # the most recent
    burst = host.idle_once()
    assert burst.chunks == (("b", 2), ("a", 2)) and burst.stop == "fresh"
    assert host.reader.tails.num_made == 2 and len(host.reader.tails) == 2
    assert host.idle_once().ms == 0.0
    check_refs(host.reader)
