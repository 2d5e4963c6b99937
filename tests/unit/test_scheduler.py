"""The scheduler on virtual time with a fake reader and a fake host: exact slice plans."""
import pytest

from shadow_plugin.scheduling.scheduler import (
    CostModel,
    Scheduler,
    SchedulerConfig,
    Slice,
    VirtualClock,
)

G = 512


class FakeReader:
    """Sessions as (ids held, C); a chunk costs `chunk_ms` of virtual time."""

    def __init__(self, clock, chunk_ms=5.0):
        self.clock, self.chunk_ms = clock, chunk_ms
        self.ids, self.c, self.answers = {}, {}, []
        self.tails, self.tail_ms = [], None     # tails made (tail_ms each) when a test sets it

    def add(self, session, n):
        self.ids[session] = self.ids.get(session, 0) + n
        self.c.setdefault(session, 0)

    def backlog(self, s):
        return self.ids[s] - self.c[s]

    def committed(self, s):
        return self.c[s]

    def read_chunk(self, s):
        assert self.backlog(s) >= G
        self.c[s] += G
        self.clock.t += self.chunk_ms / 1e3
        return self.chunk_ms

    def answer(self, s, at):
        self.answers.append((s, at, self.c[s]))

    def make_tail(self, sessions):
        """A tail due for each session once its whole chunks are read (tail_ms each), when
        tail_ms is set."""
        for s in sessions if self.tail_ms is not None else ():
            if self.backlog(s) < G and s not in self.tails:
                self.tails.append(s)
                self.clock.t += self.tail_ms / 1e3
                return self.tail_ms
        return None


def make(chunk_ms=5.0, busy=lambda: False, **cfg):
    clock = VirtualClock()
    reader = FakeReader(clock, chunk_ms)
    sched = Scheduler(SchedulerConfig(**cfg), reader, clock, busy, CostModel(chunk_ms * 2, G))
    return sched, reader, clock


def test_share_counts_from_the_first_token_not_the_turn_start():
    sched, reader, clock = make()
    reader.add("s", 40 * G)
    sched.turn_started("s")
    clock.t = 17.0                                   # a 17 s prefill earns nothing
    sched.output("s")
    assert sched.between_rounds("s") == Slice("ration", (), 0.0, "ration")
    clock.t = 17.5                                   # 2 % of 0.5 s = 10 ms: two 5 ms chunks
    assert sched.between_rounds("s") == Slice("ration", (("s", 2),), 10.0, "ration")
    assert sched.ration_ms("s") == pytest.approx(0.2)   # the 10 ms it read earned 0.2 ms
    clock.t = 47.5                                   # 2 % of 30 s = 600 ms earned, slice cap 150
    assert sched.between_rounds("s") == Slice("ration", (("s", 30),), 150.0, "ration")


def test_a_slice_starts_only_when_its_chunks_and_its_expected_overhead_fit_the_ration():
    """What the host charged beyond a slice's chunks (its syncs) is expected of the next
    slices too (the mean of the last 4): with 6 ms charged a slice, a 5-ms chunk needs 11 ms
    of ration, so the turn's ration is not overdrawn by a slice's syncs."""
    sched, reader, clock = make(share=0.02)
    reader.add("s", 40 * G)
    sched.turn_started("s")
    sched.output("s")
    clock.t = 0.5                                    # 2 % of 0.5 s = 10 ms: two 5-ms chunks
    assert sched.slice_stop("s") is None and sched.slice_overhead_ms() == 0.0
    assert sched.between_rounds("s").chunks == (("s", 2),)
    sched.charge("s", 6.0)                           # the slice's syncs, as Host charges them
    assert sched.slice_overhead_ms() == 6.0 and sched.turns["s"].used_ms == 16.0
    clock.t = 1.25                                   # earned 25 ms, used 16: 9 ms left
    assert sched.ration_ms("s") == pytest.approx(9.0)
    assert sched.slice_stop("s") == "ration"         # 5 + 6 > 9: not started
    assert sched.between_rounds("s").chunks == ()
    clock.t = 1.35                                   # 11 ms left: one chunk and its overhead
    assert sched.slice_stop("s") is None
    assert sched.between_rounds("s").chunks == (("s", 1),)
    sched.charge("s", 2.0)
    assert sched.slice_overhead_ms() == 4.0          # the mean of the charges seen
    sched.charge("s", 0.0)                           # nothing beyond the chunks: no sample
    assert sched.slice_overhead_ms() == 4.0


def test_one_stall_charged_to_a_slice_does_not_starve_the_ration_of_later_turns():
    """A slice whose first sync waited behind a stall (the host's long prefill queued on the
    device) is charged 600 ms; the slices after it expect at most a chunk's estimate of
    overhead, so a later turn's ration starts a slice once it holds two chunks' estimates
    (without the cap no slice would ever start again: none would be charged anew)."""
    sched, reader, clock = make(share=0.02)
    reader.add("s", 80 * G)
    sched.turn_started("s")
    sched.output("s")
    clock.t = 0.5
    assert sched.between_rounds("s").chunks == (("s", 2),)
    sched.charge("s", 600.0)                         # the stall
    sched.turn_finished("s")
    sched.turn_started("s")
    sched.output("s")
    clock.t += 0.49                                  # 9.8 ms earned: 5 + 5 do not fit
    assert sched.slice_stop("s") == "ration"
    clock.t += 0.02                                  # 10.2 ms: the chunk and its overhead
    assert sched.slice_stop("s") is None
    assert sched.between_rounds("s").chunks == (("s", 1),)
    clock.t += 100.0                                 # and so on, whatever the stall
    assert sched.slice_stop("s") is None


def test_a_slices_expected_overhead_is_paid_from_the_ration_not_from_slice_ms():
    """slice_ms bounds a slice's chunks (5 ms here, slice_ms 8); the overhead a slice is
    expected to cost beyond them (6 ms charged each time) comes out of the turn's ration, so
    with ration to spare slices go on being started."""
    sched, reader, clock = make(share=0.02, slice_ms=8.0)
    reader.add("s", 40 * G)
    sched.turn_started("s")
    sched.output("s")
    for i in range(3):
        clock.t += 10.0                              # 200 ms more of ration
        assert sched.slice_stop("s") is None, i
        assert sched.between_rounds("s").chunks == (("s", 1),)
        sched.charge("s", 6.0)
    assert sched.turns["s"].used_ms == pytest.approx(33.0)


def test_idle_burst_reads_newest_turn_first_then_by_recency():
    sched, reader, clock = make(chunk_ms=100.0, idle_burst_s=1.0)
    for s, n in (("old", 3 * G), ("new", 4 * G)):
        reader.add(s, n)
        sched.turn_started(s)
        sched.turn_finished(s)
    burst = sched.idle_burst()
    assert burst == Slice("idle", (("new", 4), ("old", 3)), 700.0, "fresh")
    reader.add("old", 20 * G)
    burst = sched.idle_burst()                       # 1 s at 100 ms a chunk: 10 chunks
    assert burst == Slice("idle", (("old", 10),), 1000.0, "budget")


def test_once_all_are_fresh_the_idle_window_makes_tails_most_recent_first():
    sched, reader, clock = make(chunk_ms=100.0, idle_burst_s=1.0)
    reader.tail_ms = 30.0
    for s, n in (("old", 3 * G + 70), ("new", 4 * G + 70)):
        reader.add(s, n)
        sched.turn_started(s)
        sched.turn_finished(s)
    burst = sched.idle_burst()
    assert burst == Slice("idle", (("new", 4), ("old", 3)), 760.0, "fresh")
    assert reader.tails == ["new", "old"]
    assert sched.idle_burst() == Slice("idle", (), 0.0, "fresh")     # none due: nothing
    reader.add("old", 2 * G)
    sched.turn_started("old")
    assert sched.idle_burst() is None and reader.tails == ["new", "old"]   # a turn is open


def test_a_chunk_estimated_past_the_whole_burst_is_still_read_one_a_burst():
    """A chunk whose cost estimate exceeds idle_burst_s (a loaded CPU at a long context) is
    read alone in its burst: without it the burst read nothing, the estimate never changed
    and the session was never read again (seen on a 2-core CPU at load 6: stuck at 16,896)."""
    sched, reader, clock = make(chunk_ms=3000.0, idle_burst_s=2.0)
    reader.add("s", 3 * G)
    sched.turn_started("s")
    sched.turn_finished("s")
    for _ in range(2):
        assert sched.idle_burst() == Slice("idle", (("s", 1),), 3000.0, "budget")
    assert sched.idle_burst() == Slice("idle", (("s", 1),), 3000.0, "fresh")


def test_a_session_known_only_by_outputs_is_read_when_the_others_are_fresh():
    """After a restart a host may continue a session with outputs and an end, no turn: the
    idle window reads it too, after the sessions whose turns it saw."""
    sched, reader, clock = make(chunk_ms=100.0, idle_burst_s=1.0)
    reader.add("seen", 2 * G)
    sched.turn_started("seen")
    sched.turn_finished("seen")
    reader.add("restored", 3 * G)
    sched.output("restored")
    sched.turn_finished("restored")
    assert sched.idle_burst() == Slice("idle", (("seen", 2), ("restored", 3)), 500.0, "fresh")


def test_a_host_request_mid_burst_stops_it_before_the_next_chunk():
    arrived = []                                     # a request arrives after the third chunk
    sched, reader, clock = make(busy=lambda: bool(arrived))
    reader.add("s", 10 * G)
    sched.turn_started("s")
    sched.turn_finished("s")
    real_read = reader.read_chunk

    def read_then_request(s):
        ms = real_read(s)
        if reader.c[s] == 3 * G:
            arrived.append(clock.t)
        return ms
    reader.read_chunk = read_then_request
    burst = sched.idle_burst()
    assert burst.stop == "host" and burst.chunks == (("s", 3),)


def test_no_idle_reading_while_busy_or_a_turn_is_open():
    busy = [True]
    sched, reader, clock = make(busy=lambda: busy[0])
    reader.add("s", 4 * G)
    sched.turn_started("s")
    assert sched.idle_burst() is None                # busy
    busy[0] = False
    assert sched.idle_burst() is None                # the turn is still open
    sched.turn_finished("s")
    assert sched.idle_burst().chunks == (("s", 4),)


def test_stalled_says_why_the_idle_window_reads_nothing():
    """Issue 33: a turn open and no round coming (its session, since when), or the host's busy
    signal; None once the idle window may read."""
    busy = [False]
    sched, reader, clock = make(busy=lambda: busy[0], turn_timeout_s=600.0)
    reader.add("s", 4 * G)
    assert sched.stalled() is None
    clock.t = 10.0
    sched.turn_started("s")
    clock.t = 12.0
    sched.output("s")
    clock.t = 15.0
    sched.between_rounds("s")
    clock.t = 45.0
    (turn,) = sched.stalled()["turns"]
    assert sched.stalled()["why"] == "turn_open"
    assert turn == {"session": "s", "open_s": 35.0, "since_first_token_s": 33.0,
                    "since_last_event_s": 33.0, "since_last_round_s": 30.0,
                    "closes_in_s": 567.0}
    sched.turn_finished("s")
    busy[0] = True
    assert sched.stalled() == {"why": "host_busy"}
    busy[0] = False
    assert sched.stalled() is None


def test_back_to_back_requests_leave_only_the_ration():
    busy = [False]
    sched, reader, clock = make(busy=lambda: busy[0])
    reader.add("s", 100 * G)
    for turn in range(3):                            # requests back to back: never idle
        sched.turn_started("s")
        busy[0] = True
        clock.t += 1.0
        sched.output("s")
        clock.t += 10.0
        sched.between_rounds("s")                    # 2 % of 10 s = 200 ms, capped at 150
        sched.turn_finished("s")
        assert sched.idle_burst() is None
    assert reader.committed("s") == 3 * 30 * G       # one 150 ms slice of 5 ms chunks a turn


def test_question_with_an_insertion_point_is_answered_at_its_grid_line():
    sched, reader, clock = make()
    for s in "ab":                                   # b is the most recent turn...
        reader.add(s, 10 * G)
        sched.turn_started(s)
        sched.turn_finished(s)
    sched.add_question("a", 3 * G + 100)             # ...but a's question comes first
    burst = sched.idle_burst()
    assert reader.answers == [("a", 3 * G + 100, 3 * G)]   # answered at line 3G, not past it
    assert burst.chunks == (("a", 10), ("b", 10)) and burst.stop == "fresh"   # a 3, b 10, a 7
    sched.add_question("b", 5)                       # below C now: answered at once
    assert reader.answers[-1] == ("b", 5, 10 * G)


def test_cost_model_uses_recent_chunks_of_similar_context():
    cost = CostModel(100.0, G, band_tokens=8192, keep=2)
    assert cost.estimate(1000) == 51.2
    for ms in (10, 20, 30):
        cost.observe(1000, ms)
    assert cost.estimate(5000) == 25.0 and cost.estimate(9000) == 51.2


def test_config_from_env():
    cfg = SchedulerConfig.from_env({"SHADOW_SHARE": "0.05", "SHADOW_SLICE_MS": "80",
                                    "QWEN38_SHADOW_POLL_S": "9"})   # the seed's prefix: not read
    assert (cfg.share, cfg.slice_ms, cfg.poll_s, cfg.idle_burst_s) == (0.05, 80.0, 0.2, 2.0)
    with pytest.raises(ValueError, match="SHADOW_POLL_S"):
        SchedulerConfig.from_env({"SHADOW_POLL_S": "fast"})
    assert (cfg.idle_trust, cfg.idle_at_finish) == (0.5, True)
    seed = SchedulerConfig.from_env({"SHADOW_IDLE_TRUST": "0", "SHADOW_IDLE_AT_FINISH": "0"})
    assert (seed.idle_trust, seed.idle_at_finish) == (0.0, False)
    with pytest.raises(ValueError, match="SHADOW_IDLE_AT_FINISH='yes' must be 0 or 1"):
        SchedulerConfig.from_env({"SHADOW_IDLE_AT_FINISH": "yes"})
    for var, value, field in (("SHADOW_POLL_S", "0", "poll_s"), ("SHADOW_POLL_S", "nan", "poll_s"),
                              ("SHADOW_IDLE_BURST_S", "-2", "idle_burst_s"),
                              ("SHADOW_SHARE", "-0.5", "share"), ("SHADOW_SHARE", "1.5", "share"),
                              ("SHADOW_SLICE_MS", "-10", "slice_ms"),
                              ("SHADOW_IDLE_TRUST", "inf", "idle_trust")):
        with pytest.raises(ValueError, match=f"{var}='{value}': {field} must be finite"):
            SchedulerConfig.from_env({var: value})
    with pytest.raises(ValueError, match="idle_trust must be finite and >= 0, got -1"):
        SchedulerConfig(idle_trust=-1)


def test_an_abandoned_turn_stops_shutting_the_idle_window():
    sched, reader, clock = make(turn_timeout_s=600.0)
    reader.add("s", 2 * G)
    sched.turn_started("s")                          # the client crashed: no end ever comes
    clock.t = 599.0
    assert sched.idle_burst() is None
    clock.t = 601.0
    assert sched.idle_burst().chunks == (("s", 2),)


def test_idle_trust_leaves_what_the_gaps_cover_to_the_idle_window():
    """With idle_trust 0.5 (the default) and gaps of 1.5 s between turns, a turn's 16 chunks
    (80 ms, within half of 1.5 s after four gaps: the idle window opens at the finish) are left
    to the idle window: no ration slice. A backlog larger than the promise, a pending
    question, fewer than four gaps seen, or idle_trust 0 read in the ration as before; without
    idle_at_finish the promise is a poll shorter."""
    sched, reader, clock = make()
    t = 0.0
    for i in range(5):                               # four gaps of 1.5 s seen by the 5th turn
        s = f"r{i}"
        reader.add(s, 16 * G)
        clock.t = t
        sched.turn_started(s)
        sched.output(s)
        clock.t = t + 10.0                           # 10 s of decode: 200 ms of ration
        sl = sched.between_rounds(s)
        want = Slice("ration", (), 0.0, "idle") if i == 4 else Slice("ration", ((s, 16),),
                                                                      80.0, "fresh")
        assert sl == want, (i, sl)
        assert sched.slice_due(s) is False
        sched.turn_finished(s)
        reader.c[s] = reader.ids[s]                  # the idle window reads the rest
        t = clock.t + 1.5
    assert sched.expected_idle_ms() == pytest.approx(1500.0)
    late = Scheduler(SchedulerConfig(idle_at_finish=False), reader, clock, lambda: False,
                     CostModel(10.0, G), gaps=sched.gaps)
    assert late.expected_idle_ms() == pytest.approx(1300.0)
    s = "big"                                        # 160 chunks = 800 ms > 750 ms promised
    reader.add(s, 160 * G)
    clock.t = t
    sched.turn_started(s)
    sched.output(s)
    clock.t += 10.0
    assert sched.between_rounds(s).chunks == ((s, 30),)        # the 150 ms slice cap
    reader.c[s] = reader.ids[s] - 16 * G             # 16 chunks left: within the promise
    assert sched.between_rounds(s).stop == "idle"
    sched.add_question(s, reader.ids[s])             # a question pending: read for it
    assert sched.between_rounds(s).chunks == ((s, 10),)        # the 200 ms ration's rest
    off, reader0, _ = make(idle_trust=0.0)
    assert SchedulerConfig().idle_trust == 0.5 and off.leave_to_idle("x") is False


def test_host_share_sums_closed_and_open_turns():
    """host_share: the ration used over the decode it was earned over (first token to close,
    or to now for an open turn); a turn without a first token earned nothing."""
    sched, reader, clock = make()
    reader.add("a", 40 * G)
    sched.turn_started("a")
    clock.t = 1.0
    sched.output("a")
    clock.t = 11.0                                    # 10 s of decode: 200 ms earned
    sl = sched.between_rounds("a")
    assert sl.ms == 150.0                             # the slice cap
    sched.turn_finished("a")                          # closed at 11.15 s (the reads took 150 ms)
    reader.add("b", G)
    sched.turn_started("b")                           # open, no first token: no decode yet
    assert sched.host_share() == pytest.approx((150.0, 10150.0))
    sched.output("b")
    clock.t += 2.0
    sched.forget("b")                                 # a deleted session's turn counts too
    assert sched.host_share() == pytest.approx((150.0, 12150.0))


def test_leave_to_idle_is_kept_a_tenth_of_a_second_between_events():
    """The host asks every round: the answer (which sums every session's backlog) is kept for
    IDLE_MEMO_S of the clock; a turn event or a chunk read drops it."""
    from shadow_plugin.scheduling.scheduler import IDLE_MEMO_S
    sched, reader, clock = make()
    asked = []
    real = reader.backlog
    reader.backlog = lambda s: asked.append(s) or real(s)
    for i in range(4):                               # four 1.5 s gaps: trusted
        reader.add(f"r{i}", G)
        clock.t = 2.0 * i
        sched.turn_started(f"r{i}")
        clock.t += 0.5
        sched.turn_finished(f"r{i}")
    reader.add("s", 2 * G)
    clock.t = 10.0
    sched.turn_started("s")
    assert sched.leave_to_idle("s") and asked
    asked.clear()
    clock.t += IDLE_MEMO_S / 2
    assert sched.leave_to_idle("s") and not asked           # kept
    clock.t += IDLE_MEMO_S
    assert sched.leave_to_idle("s") and asked               # asked again
    reader.add("s", 400 * G)                                 # more than the gaps promise
    assert sched.leave_to_idle("s")                          # still the kept answer
    sched.idle_memo = None
    assert not sched.leave_to_idle("s")


def test_a_request_the_shadow_does_not_follow_ends_the_gap():
    """Gaps (for idle trust) are the host's idle time: a poll that finds the host busy with no
    turn open (a request of a session the shadow does not follow) ends the gap; the next idle
    poll starts another, which the next followed turn ends."""
    busy = [False]
    sched, reader, clock = make(busy=lambda: busy[0])
    reader.add("s", G)
    sched.turn_started("s")
    clock.t = 2.0
    sched.turn_finished("s")
    clock.t = 3.0
    busy[0] = True
    assert sched.idle_burst() is None and list(sched.gaps) == [1.0]
    clock.t = 4.0
    assert sched.idle_burst() is None and list(sched.gaps) == [1.0]     # once
    clock.t, busy[0] = 9.0, False
    sched.idle_burst()
    clock.t = 10.5
    sched.turn_started("s")
    assert list(sched.gaps) == [1.0, 1.5]


class BatchReader(FakeReader):
    """FakeReader with read_chunks: a batch of k chunks costs chunk_ms x (1 + (k - 1) / 4)
    of virtual time (one forward); `batches` records each call's sessions."""

    def __init__(self, clock, chunk_ms=5.0):
        super().__init__(clock, chunk_ms)
        self.batches = []

    def read_chunks(self, sessions):
        read = [s for s in sessions if self.backlog(s) >= G]
        for s in read:
            self.c[s] += G
        ms = self.chunk_ms * (1 + (len(read) - 1) / 4)
        self.clock.t += ms / 1e3
        self.batches.append(list(sessions))
        return ms, read


def make_batch(chunk_ms=100.0, **cfg):
    clock = VirtualClock()
    reader = BatchReader(clock, chunk_ms)
    sched = Scheduler(SchedulerConfig(**cfg), reader, clock, lambda: False,
                      CostModel(chunk_ms / G * 1000, G))
    return sched, reader, clock


def test_the_idle_window_reads_a_chunk_of_several_sessions_in_one_forward():
    sched, reader, clock = make_batch(batch_sessions=4, idle_burst_s=2.0)
    for s, n in (("a", 2 * G), ("b", 3 * G), ("c", 2 * G + 7)):
        reader.add(s, n)
        sched.turn_started(s)
        sched.turn_finished(s)
    burst = sched.idle_burst()
    assert reader.batches == [["c", "b", "a"], ["c", "b", "a"]]      # newest first
    assert burst.stop == "fresh" and dict(burst.chunks) == {"a": 2, "b": 3, "c": 2}
    assert burst.ms == pytest.approx(2 * 150.0 + 100.0)              # the last one alone
    assert sched.cost.estimate(0, 3) == pytest.approx(150.0)         # learnt for batches of 3
    assert sched.cost.estimate(0) == pytest.approx(100.0)


def test_a_batch_is_cut_to_the_burst_left_and_a_question_goes_first():
    sched, reader, clock = make_batch(batch_sessions=8, idle_burst_s=0.25)
    for s in ("a", "b", "c", "d"):
        reader.add(s, 4 * G)
        sched.turn_started(s)
        sched.turn_finished(s)
    sched.add_question("a", 2 * G)
    burst = sched.idle_burst()
    # no batch seen yet: a batch of k is estimated at k chunks (100 ms each), so 2 of the 4
    # fit in 250 ms, the session with a question first; that batch cost 125 ms, learnt, so the
    # next batch of 2 fits the 125 ms left; then nothing does
    assert reader.batches == [["a", "d"], ["a", "d"]]
    assert burst == Slice("idle", (("a", 2), ("d", 2)), 250.0, "budget")
    assert reader.answers == [("a", 2 * G, 2 * G)]


def test_cost_model_batches_fall_back_to_their_chunks():
    cost = CostModel(100.0, G)
    assert cost.estimate(0, 4) == pytest.approx(4 * 51.2)
    cost.observe(0, 30.0)
    assert cost.estimate(100, 4) == pytest.approx(120.0)
    cost.observe(0, 50.0, 4)
    assert cost.estimate(100, 4) == 50.0 and cost.estimate(100) == 30.0
    assert cost.estimate(9000, 4) == pytest.approx(4 * 51.2)          # another band


@pytest.mark.parametrize("value,match", [("0", "1, 64"), ("65", "1, 64"),
                                         ("x", "not an integer"), ("2.5", "not an integer")])
def test_batch_sessions_from_the_environment(value, match):
    assert SchedulerConfig.from_env({"SHADOW_BATCH_SESSIONS": "4"}).batch_sessions == 4
    assert SchedulerConfig.from_env({}).batch_sessions == 1
    with pytest.raises(ValueError, match=match):
        SchedulerConfig.from_env({"SHADOW_BATCH_SESSIONS": value})
