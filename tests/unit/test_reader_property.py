"""The test the project is built around: after any history of feeds (appends, rewrites),
reads in any budgets and asks, the committed state equals a fresh prefill on the same grid, bit
for bit; an ask changes no state byte and depends only on ids[:at] and the question."""
import random

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadow_plugin.reader.reader import Reader

G = 64
SIZES = st.one_of(st.sampled_from([1, G - 1, G, G + 1, 2 * G, 3 * G + 5]), st.integers(0, 200))
QUESTION = "Which kind of turn is this?"
CHOICES = ["chat", "code_edit", "debug"]

op = st.one_of(
    st.tuples(st.just("prompt"), st.sampled_from(["append", "zero", "checkpoint", "below_c",
                                                  "tail"]), SIZES, st.booleans()),
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
    if mode == "tail":
        return rng.randrange(c, len(ids) + 1)
    return len(ids)


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
       max_cps=st.sampled_from([1, 2, 6]))
def test_any_history_equals_fresh_prefill(tiny, ops, seed, max_cps):
    rng = random.Random(seed)
    reader = Reader(tiny, grid=G, max_checkpoints=max_cps)
    sid = "s"
    reader.feed(sid, [rng.randrange(248320) for _ in range(rng.randrange(1, 300))], "prompt")
    for _ in range(rng.randrange(0, 3)):             # a few whole turns, so checkpoints exist
        ops = [("turn", rng.randrange(1, 200), rng.randrange(0, 100))] + ops
    for o in ops:
        if o[0] == "prompt":
            _, mode, n, episode = o
            held = reader.ids(sid)
            d = _cut(reader, sid, mode, rng)
            new = held[:d] + [rng.randrange(248320) for _ in range(n)]
            if not new:
                new = [1]
            res = reader.feed(sid, new, "prompt", episode_start=episode)
            if res.rolled_back_to is not None:
                assert res.rolled_back_to <= res.first_difference
        elif o[0] == "turn":
            reader.feed(sid, reader.ids(sid) + [rng.randrange(248320) for _ in range(o[1])],
                        "prompt", episode_start=rng.random() < 0.3)
            reader.read(sid)
            reader.feed(sid, [rng.randrange(248320) for _ in range(o[2])], "output")
        elif o[0] == "output":
            reader.feed(sid, [rng.randrange(248320) for _ in range(o[1])], "output")
        elif o[0] == "read":
            before = reader.committed(sid)
            r = reader.read(sid, max_chunks=o[1])
            assert reader.committed(sid) == before + r.num_read_tokens
            assert reader.backlog(sid) < G or o[1] is not None
        else:
            n, c = len(reader.ids(sid)), reader.committed(sid)
            at = {"end": n, "random": rng.randrange(0, n + 1), "below_c": max(0, c - 7),
                  "zero": 0}[o[1]]
            if at > 0:
                _ask_checks(tiny, reader, sid, at)
        assert reader.committed(sid) % G == 0 and reader.committed(sid) <= len(reader.ids(sid))
        assert len(reader.checkpoint_positions(sid)) <= max_cps
        assert reader.check_exact(sid)
