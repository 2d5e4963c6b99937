"""The test the project is built around: after any history of feeds (appends, rewrites),
reads in any budgets and asks, the committed state equals a fresh prefill on the same grid, bit
for bit; an ask changes no state byte and depends only on ids[:at] and the question. Its
batched arm (issue 36): several sessions read together in random batches (one forward for a
chunk of each), asked several questions in one forward, sharing prefixes, parked and restored,
each equal to its fresh prefill after every step. With
questions between steps and a small GDN budget (issue 33), a rewrite resumes at or above the
deepest line at or below its first difference that the tip ring (the last TIP_LINES lines C
stood at) or a checkpoint holds: within one page of the change when the ring holds the line
below it. Its tails arm: answers with questions' tails kept (or evicted, or made by the idle
window's call) equal those of a reader that keeps none."""
import random

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from block_store.checkpoints import TIP_LINES
from shadow_plugin.reader import fork
from shadow_plugin.reader.reader import Reader

G = 64
SIZES = st.one_of(st.sampled_from([1, G - 1, G, G + 1, 2 * G, 3 * G + 5]), st.integers(0, 200))
QUESTION = "Which kind of turn is this?"
CHOICES = ["chat", "code_edit", "debug"]

op = st.one_of(
    st.tuples(st.just("prompt"), st.sampled_from(["append", "zero", "checkpoint", "below_c",
                                                  "tail", "ring"]), SIZES, st.booleans()),
    st.tuples(st.just("output"), SIZES),
    st.tuples(st.just("read"), st.one_of(st.none(), st.integers(0, 3))),
    st.tuples(st.just("turn"), SIZES, SIZES),       # prompt = held + new, read all, output
    st.tuples(st.just("ask"), st.sampled_from(["end", "random", "below_c", "zero"])),
)


def _cut(reader, sid, mode, rng):
    ids, c = reader.ids(sid), reader.committed(sid)
    cps = reader.checkpoint_positions(sid)
    if mode == "zero" or not ids:
        return 0
    below = [p for p in cps if p < c]
    if mode == "checkpoint" and below:               # inside a checkpointed span, below C
        p = rng.choice(below)
        return rng.randrange(p, c)
    if mode == "below_c" and c:
        return c - 1
    if mode == "ring" and c:                         # within the tip ring's pages below C
        return rng.randrange(max(0, c - (TIP_LINES - 1) * G), c)
    if mode == "tail":
        return rng.randrange(c, len(ids) + 1)
    return len(ids)


class Ring:
    """The test's own model of the tip ring: the lines C stood at, newest last (a chunk
    committed, the line a prompt resumed at), the last TIP_LINES of them kept; lines above a
    rewrite's first difference go (they hold the old ids' states)."""

    def __init__(self):
        self.lines: list[int] = []

    def stood(self, line: int) -> None:
        if line > 0:
            self.lines = [x for x in self.lines if x != line][-(TIP_LINES - 1):] + [line]

    def committed(self, before: int, after: int) -> None:
        for line in range(before + G, after + 1, G):
            self.stood(line)

    def resumed(self, d: int, line: int, before: int) -> None:
        self.lines = [x for x in self.lines if x <= min(d, line)]
        if line != before:
            self.stood(line)


def _feed_prompt(reader, sid, ring, new, episode):
    """Feed a prompt; assert where it resumed against the ring and the checkpoints held."""
    known = reader.knows(sid)
    c, cps = (reader.committed(sid), reader.checkpoint_positions(sid)) if known else (0, [])
    res = reader.feed(sid, new, "prompt", episode_start=episode)
    d, line = res.first_difference, reader.committed(sid)
    if res.rolled_back_to is not None:
        assert res.rolled_back_to <= d
    if d < c:              # a change below C: the deepest line held at or below d at least
        held = max([x for x in ring.lines + cps if x <= d], default=0)
        assert line >= held
        if d // G * G in ring.lines:           # the ring holds the line below the change:
            assert d - line < G                # at most a page below it is read again
    ring.resumed(d, line, c)
    return res


def _snapshot(reader, sid):
    return {k: v.clone() for k, v in reader.state_tensors(sid).items()}


def _ask_checks(model, reader, sid, at):
    c_before = reader.committed(sid)
    before = _snapshot(reader, sid)
    a1 = reader.ask(sid, QUESTION, CHOICES, at=at)
    if reader.committed(sid) == c_before:           # no chunk committed on the way
        after = reader.state_tensors(sid)
        assert all(torch.equal(before[k], after[k]) for k in before)
    a2 = reader.ask(sid, QUESTION, CHOICES, at=at)
    assert a1.probs == a2.probs
    assert abs(sum(a1.probs) - 1) < 1e-5
    fresh = Reader(model, grid=G)       # another history, same ids[:at]
    fresh.feed("f", reader.ids(sid)[:at] or [0], "prompt")
    a3 = fresh.ask("f", QUESTION, CHOICES, at=at)
    assert a3.probs == a1.probs


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(op, min_size=1, max_size=7), seed=st.integers(0, 2**32 - 1),
       max_cps=st.sampled_from([1, 2, 6]), gdn_entries=st.sampled_from([None, 0, 2]),
       questions=st.booleans())
def test_any_history_equals_fresh_prefill(tiny, ops, seed, max_cps, gdn_entries, questions):
    """gdn_entries: the GDN budget in entries of random:tiny (None: the default); questions:
    a question at the end of the ids between steps half the time (it commits the backlog's
    whole chunks, as replay's question after every turn does)."""
    rng = random.Random(seed)
    budget = None if gdn_entries is None else gdn_entries * 61440
    reader = Reader(tiny, grid=G, max_checkpoints=max_cps, gdn_bytes=budget)
    sid, ring = "s", Ring()
    _feed_prompt(reader, sid, ring, [rng.randrange(248320) for _ in range(rng.randrange(1, 300))],
                 None)
    for _ in range(rng.randrange(0, 3)):             # a few whole turns, so checkpoints exist
        ops = [("turn", rng.randrange(1, 200), rng.randrange(0, 100))] + ops
    for o in ops:
        if o[0] == "prompt":
            _, mode, n, episode = o
            held = reader.ids(sid)
            d = _cut(reader, sid, mode, rng)
            new = held[:d] + [rng.randrange(248320) for _ in range(n)]
            _feed_prompt(reader, sid, ring, new or [1], episode)
        elif o[0] == "turn":
            _feed_prompt(reader, sid, ring, reader.ids(sid) + [rng.randrange(248320)
                                                               for _ in range(o[1])],
                         rng.random() < 0.3)
            before = reader.committed(sid)
            reader.read(sid)
            ring.committed(before, reader.committed(sid))
            reader.feed(sid, [rng.randrange(248320) for _ in range(o[2])], "output")
        elif o[0] == "output":
            reader.feed(sid, [rng.randrange(248320) for _ in range(o[1])], "output")
        elif o[0] == "read":
            before = reader.committed(sid)
            r = reader.read(sid, max_chunks=o[1])
            assert reader.committed(sid) == before + r.num_read_tokens
            assert reader.backlog(sid) < G or o[1] is not None
            ring.committed(before, reader.committed(sid))
        else:
            n, c = len(reader.ids(sid)), reader.committed(sid)
            at = {"end": n, "random": rng.randrange(0, n + 1), "below_c": max(0, c - 7),
                  "zero": 0}[o[1]]
            if at > 0:
                _ask_checks(tiny, reader, sid, at)
            ring.committed(c, reader.committed(sid))
        if questions and rng.random() < 0.5:           # a question between steps
            c = reader.committed(sid)
            reader.ask(sid, [5, 6, 7], ["x", "y"])
            ring.committed(c, reader.committed(sid))
        assert reader.committed(sid) % G == 0 and reader.committed(sid) <= len(reader.ids(sid))
        assert len(reader.checkpoint_positions(sid)) <= max_cps
        assert reader.check_exact(sid)


# -- the batched arm (issue 36): several sessions read together in random batches ------------
NUM_SESSIONS = 3
SESSION = st.integers(0, NUM_SESSIONS - 1)
batch_op = st.one_of(
    st.tuples(st.just("prompt"), SESSION, st.sampled_from(["append", "zero", "below_c",
                                                           "share"]), SIZES),
    st.tuples(st.just("output"), SESSION, SIZES),
    st.tuples(st.just("batch"), st.lists(SESSION, min_size=2, max_size=4),
              st.integers(1, 3)),                   # read_batch of these, n calls
    st.tuples(st.just("read"), SESSION),
    st.tuples(st.just("ask"), SESSION, st.integers(2, 4), st.sampled_from(["end", "random"])),
    st.tuples(st.just("park"), SESSION),
)


def _batch_prompt(reader, sids, i, mode, n, rng):
    """A prompt for session i: its ids extended, cut at 0 or below C, or another session's
    ids (a shared prefix: its pages found by key) plus new ones."""
    sid = sids[i]
    held = reader.ids(sid) if reader.knows(sid) else []
    c = reader.committed(sid) if held else 0
    if mode == "share":
        other = reader.ids(sids[(i + 1) % len(sids)])
        held, cut = other, rng.randrange(0, len(other) + 1)
    else:
        cut = {"append": len(held), "zero": 0, "below_c": max(0, c - 1)}[mode]
    new = held[:cut] + [rng.randrange(248320) for _ in range(n)]
    reader.feed(sid, new or [1], "prompt")


def _asks_equal_alone(reader, sid, k, where, rng):
    """k questions asked in one forward (ask_many) at `where`: each answer the question asked
    alone, bit for bit, and no committed byte changed."""
    n = len(reader.ids(sid))
    at = n if where == "end" else rng.randrange(1, n + 1)
    items = [([rng.randrange(248320) for _ in range(rng.choice([1, 3, 40, G + 10]))],
              CHOICES[:rng.randrange(2, 4)]) for _ in range(k)]
    c = reader.committed(sid)
    many = reader.ask_many(sid, items, at=at)
    before = _snapshot(reader, sid) if reader.committed(sid) == c else None
    for (q, ch), ans in zip(items, many):
        assert reader.ask(sid, q, ch, at=at).probs == ans.probs
    if before is not None:
        after = reader.state_tensors(sid)
        assert all(torch.equal(before[k], after[k]) for k in before)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(batch_op, min_size=2, max_size=8), seed=st.integers(0, 2**32 - 1),
       disk=st.booleans(), gdn_entries=st.sampled_from([None, 2]), graphs=st.booleans())
def test_sessions_read_in_batches_equal_their_fresh_prefills(tiny, ops, seed, disk,
                                                             gdn_entries, graphs):
    """Random sessions fed, rewritten, sharing prefixes, read together in random batches
    (Reader.read_batch: one forward for the chunks of several, on the eager adapter or
    through the CUDA-graph adapter's chunk batches, runners.batch) or alone, asked several
    questions in one forward (question batches there too), parked to disk and restored
    (from its files or from rows read ahead of the restore): after every step every
    session's committed state equals its fresh prefill, bit for bit."""
    import tempfile
    rng = random.Random(seed)
    budget = None if gdn_entries is None else gdn_entries * 61440
    folder = tempfile.mkdtemp(prefix="shadow-batch-prop-") if disk else None
    reader = Reader(tiny, grid=G, max_checkpoints=2, gdn_bytes=budget, disk_dir=folder,
                    cuda_graphs=graphs)
    sids = [f"b{i}" for i in range(NUM_SESSIONS)]
    for sid in sids:
        reader.feed(sid, [rng.randrange(248320) for _ in range(rng.randrange(1, 6 * G))],
                    "prompt")
    for o in ops:
        if o[0] == "prompt":
            _batch_prompt(reader, sids, o[1], o[2], o[3], rng)
        elif o[0] == "output":
            reader.feed(sids[o[1]], [rng.randrange(248320) for _ in range(o[2])], "output")
        elif o[0] == "batch":
            names = [sids[i] for i in o[1]]
            for _ in range(o[2]):
                before = {s: reader.committed(s) for s in set(names)}
                res = reader.read_batch(names)
                for s in set(names):
                    assert reader.committed(s) == before[s] + G * (s in res.sessions)
        elif o[0] == "read":
            reader.read(sids[o[1]], max_chunks=rng.randrange(1, 3))
        elif o[0] == "ask":
            _asks_equal_alone(reader, sids[o[1]], o[2], o[3], rng)
        elif o[0] == "park" and sids[o[1]] in reader.table.resident:
            reader.table.park(sids[o[1]])
            if folder is not None and rng.random() < 0.5:   # memory forgets its pages, and
                reader.table.forget_memory()                # a turn's events read them
                reader.prefetch(sids[o[1]])                 # ahead of the restore
        for sid in sids:
            assert reader.committed(sid) % G == 0
            assert reader.committed(sid) <= len(reader.ids(sid))
            assert reader.check_exact(sid)


# -- questions' tails (shadow_plugin.reader.tails): kept or not, the same answers -------------
TG = 256                                             # tails of 64, 128 and 192 ids exist here
tail_op = st.one_of(
    st.tuples(st.just("prompt"), SESSION, st.sampled_from(["append", "share", "below_c"]),
              st.integers(1, 2 * TG)),
    st.tuples(st.just("output"), SESSION, st.integers(1, 200)),
    st.tuples(st.just("read"), SESSION),
    st.tuples(st.just("tail"), SESSION),             # the idle window's Reader.make_tail
    st.tuples(st.just("ask"), SESSION, st.integers(1, 3), st.sampled_from(["end", "random"])),
    st.tuples(st.just("ask"), SESSION, st.integers(1, 3), st.just("end")),
    st.tuples(st.just("park"), SESSION),
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(tail_op, min_size=3, max_size=12), seed=st.integers(0, 2**32 - 1),
       max_tails=st.sampled_from([1, 2, 8]), disk=st.booleans())
def test_answers_with_tails_kept_or_not_are_the_same(tiny, ops, seed, max_tails, disk):
    """Sessions fed, rewritten, sharing prefixes, read, parked and restored, their tails made
    by the idle window's call and kept by questions (a few kept, the least recent evicted):
    every answer, one question or several at once, equals the same question's on a reader
    that keeps no tail (another history, the same ids), bit for bit; the page references
    held are the sessions', the scratch bases' and the tails' (check_refs); every committed
    state equals its fresh prefill."""
    import tempfile

    from helpers import check_refs
    rng = random.Random(seed)
    folder = tempfile.mkdtemp(prefix="shadow-tails-prop-") if disk else None
    reader = Reader(tiny, grid=TG, max_checkpoints=2, max_tails=max_tails, disk_dir=folder)
    plain = Reader(tiny, grid=TG, max_tails=0)
    sids = [f"t{i}" for i in range(NUM_SESSIONS)]
    for sid in sids:                 # each with a tail past its last line at first
        n = rng.randrange(0, 3) * TG + rng.randrange(fork.min_tail(TG), TG)   # 64-255
        reader.feed(sid, [rng.randrange(248320) for _ in range(n)], "prompt")
    for o in [("ask", 0, 2, "end")] + ops:
        sid = sids[o[1]]
        if o[0] == "prompt":
            held = reader.ids(sid)
            if o[2] == "share":
                held = reader.ids(sids[(o[1] + 1) % NUM_SESSIONS])
            cut = {"append": len(held), "share": rng.randrange(0, len(held) + 1),
                   "below_c": max(0, reader.committed(sid) - 70)}[o[2]]
            reader.feed(sid, held[:cut] + [rng.randrange(248320) for _ in range(o[3])],
                        "prompt")
        elif o[0] == "output":
            reader.feed(sid, [rng.randrange(248320) for _ in range(o[2])], "output")
        elif o[0] == "read":
            reader.read(sid)
        elif o[0] == "tail" and sid in reader.table.resident:
            reader.make_tail(sid)
        elif o[0] == "ask":
            n = len(reader.ids(sid))
            at = n if o[3] == "end" else rng.randrange(1, n + 1)
            items = [([rng.randrange(248320) for _ in range(rng.choice([3, 40, TG + 10]))],
                      CHOICES[:2]) for _ in range(o[2])]
            got = reader.ask_many(sid, items, at=at) if o[2] > 1 else \
                [reader.ask(sid, *items[0], at=at)]
            plain.feed("p", reader.ids(sid)[:at], "prompt")
            for (q, ch), ans in zip(items, got):
                assert plain.ask("p", q, ch).probs == ans.probs
                assert reader.ask(sid, q, ch, at=at).probs == ans.probs   # its tail kept now
        elif o[0] == "park" and sid in reader.table.resident:
            reader.table.park(sid)
        check_refs(reader)
        for s in sids:
            assert reader.check_exact(s)
    assert len(reader.tails) <= max_tails
