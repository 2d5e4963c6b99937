"""Several questions over one session in one forward (Reader.ask_many): each answer equal to the
same question asked alone, bit for bit; the forks share the session's pages and state and give
back what they took; bad lists refused with nothing held."""
import random
import warnings

import pytest
import torch
from helpers import check_refs, vocab_ids

from adapters.eager import EagerAdapter
from shadow_plugin.reader.reader import Reader

G = 64
ROUTER = ("Which kind of turn is this?", ["chat", "code_edit", "debug", "plan"])


def _items(rng):
    """A text question, a short id question, and questions longer than a grid (read in
    pieces), with other choices each."""
    return [ROUTER, ([5, 6, 7], ["x", "y"]),
            (vocab_ids(rng, 150), ["a", "b", "c"]),
            ("Is the user asking for code?", ["yes", "no"]),
            (vocab_ids(rng, 70), ["p", "q"])]


def _reader(tiny, n=500, seed=0, **kw):
    rng = random.Random(seed)
    r = Reader(tiny, grid=G, **kw)
    r.feed("s", vocab_ids(rng, n), "prompt")
    return r, rng


@pytest.mark.parametrize("where", ["end", "mid", "below_c", "line"])
def test_each_answer_equals_the_question_asked_alone(tiny, where, monkeypatch):
    r, rng = _reader(tiny, seed=len(where))
    r.read("s", max_chunks=5)
    n, c = len(r.ids("s")), r.committed("s")
    at = {"end": n, "mid": c + 37, "below_c": c - 90, "line": 4 * G}[where]
    items = _items(rng)
    calls = []
    forward_batch = tiny.forward_batch
    monkeypatch.setattr(tiny, "forward_batch",
                        lambda seqs, *a, **k: calls.append(len(seqs)) or forward_batch(seqs, *a,
                                                                                       **k))
    many = r.ask_many("s", items, at=at)
    assert calls and max(calls) == len(items)          # one forward for all of them
    check_refs(r)
    monkeypatch.setattr(tiny, "forward_batch", forward_batch)
    fresh = Reader(tiny, grid=G)                        # another history, the same ids[:at]
    fresh.feed("f", r.ids("s")[:at], "prompt")
    for i, ((question, choices), ans) in enumerate(zip(items, many)):
        alone = r.ask("s", question, choices, at=at)
        assert ans.probs == alone.probs and ans.label == alone.label and ans.at == at
        if i % 2 == 0:
            assert fresh.ask("f", question, choices, at=at).probs == alone.probs
    assert r.check_exact("s")
    check_refs(r)


def test_asking_many_changes_no_state_byte(tiny):
    r, rng = _reader(tiny, seed=3)
    r.read("s")
    before = {k: v.clone() for k, v in r.state_tensors("s").items()}
    r.ask_many("s", _items(rng))
    after = r.state_tensors("s")
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_batch_of_one_and_the_steps(tiny):
    """ask_many of one question is ask; begin/advance/finish give ask_many's answers."""
    r, rng = _reader(tiny, seed=4)
    items = _items(rng)
    assert r.ask_many("s", items[:1])[0].probs == r.ask("s", *items[0]).probs
    pendings = r.begin_ask_many("s", items)
    steps = 0
    while r.advance_many(pendings):
        steps += 1
    assert steps >= 1                                   # the long ones read pieces
    got = r.finish_ask_many(pendings)
    assert [a.probs for a in got] == [a.probs for a in r.ask_many("s", items)]
    check_refs(r)


def test_without_batch_invariant_gemms_the_batch_runs_one_at_a_time(tiny, monkeypatch):
    r, rng = _reader(tiny, seed=5)
    items = _items(rng)
    want = [a.probs for a in r.ask_many("s", items)]
    assert isinstance(r.adapter, EagerAdapter)
    monkeypatch.setattr(r.adapter, "batches", lambda *lengths: False)
    monkeypatch.setattr(tiny, "forward_batch", lambda *a, **k: pytest.fail("batched"))
    assert [a.probs for a in r.ask_many("s", items)] == want
    forwards = []                         # one forward a step: a piece or one last forward
    for name in ("read_chunk", "fork_logits"):
        real = getattr(r.adapter, name)
        monkeypatch.setattr(r.adapter, name, lambda *a, _real=real, **k:
                            forwards.append(1) or _real(*a, **k))
    pendings = r.begin_ask_many("s", items)
    steps = []
    while True:
        before = len(forwards)
        more = r.advance_many(pendings)
        steps.append(len(forwards) - before)
        if not more:
            break
    assert set(steps) == {1} and len(steps) == len(forwards)
    got = r.finish_ask_many(pendings)
    assert len(forwards) == len(steps)                  # nothing left for the finish
    assert [a.probs for a in got] == want
    check_refs(r)


def test_bad_lists_are_refused_with_nothing_held(tiny):
    r, _ = _reader(tiny, seed=6)
    c = r.committed("s")
    with pytest.raises(ValueError, match="non-empty list"):
        r.ask_many("s", [])
    with pytest.raises(ValueError, match=r"questions\[1\]"):
        r.ask_many("s", [ROUTER, ("q", ["only one"])])
    with pytest.raises(ValueError, match=r"questions\[0\]: a \(question, choices\) pair"):
        r.ask_many("s", ["not a pair"])
    with pytest.raises(ValueError, match=r"questions\[1\]: .* got a dict"):   # the HTTP shape
        r.ask_many("s", [ROUTER, {"question": "q", "choices": ["a", "b"]}])
    for bad in (None, 5, "ab", {"question": "q"}):
        with pytest.raises(ValueError, match="non-empty list"):
            r.ask_many("s", bad)
    with pytest.raises(KeyError):
        r.ask_many("nobody", [ROUTER])
    with pytest.raises(ValueError, match=r"questions\[1\]"):      # checked, nothing read
        r.render_questions("s", [ROUTER, ("q", ["a", "a"])])
    assert r.committed("s") == c                        # nothing read on the way
    check_refs(r)


def test_questions_render_as_the_ask_renders_them(tiny):
    """Reader.render_questions (what the service checks before reading toward `at`): the ids
    begin_ask_many forwards for each question, at the end and at an earlier `at`."""
    r, rng = _reader(tiny, seed=8)
    items = [ROUTER, ("Is the user asking for code?", ["yes", "no"]), ([5, 6, 7], ["x", "y"])]
    for at in (None, 100):
        rendered = r.render_questions("s", items, at)
        pendings = r.begin_ask_many("s", items, at)
        try:
            assert [len(q) for q in rendered] == [p.num_extra_ids for p in pendings]
            assert rendered[2] == [5, 6, 7]
            assert r.render_question("s", *items[1], at) == rendered[1]
        finally:
            r.cancel_many(pendings)
        pending = r.begin_generate("s", "Summarize.", 4, at)
        try:
            assert len(r.render_prompt("s", "Summarize.", at)) == pending.num_extra_ids
        finally:
            r.cancel(pending)
    with pytest.raises(ValueError, match="prompt must not be empty"):
        r.render_prompt("s", "  ")
    check_refs(r)
    check_refs(r)


def test_the_graph_adapter_answers_a_list_in_one_forward(tiny):
    """The CUDA-graph adapter (its bodies run eagerly on the CPU) answers the questions of one
    ask that pad to one bucket in one forward (runners.batch), each answer its
    question's alone, bit for bit; its first batch of a shape was checked against the forks
    run alone; last forwards of a whole grid are never a question batch's."""
    r, rng = _reader(tiny, seed=7, cuda_graphs=True)
    a = r.adapter
    assert a.batches() and a.batches([3, 40]) and not a.batches([3]) and not a.batches([G, 3])
    items = [ROUTER, ([5, 6, 7], ["x", "y"]), ("Is the user asking for code?", ["yes", "no"]),
             (vocab_ids(rng, 70), ["p", "q"])]          # three of one bucket, one of another
    many = r.ask_many("s", items)
    stats = a.graph_stats()
    # three at the session's end in a batch of 4 (the last padded with a copy of the third)
    if not tiny.gemms_keep_tile_bits(4 * G, G):  # this CPU's GEMMs: a batch checked, refused
        assert stats["question_batch_bits"] == {"4x64": False}
    else:
        assert stats["question_batch_bits"] == {"4x64": True}
        assert stats["num_question_batches"] == 1 and stats["question_batches"] == ["4x64"]
    alone = [r.ask("s", q, c).probs for q, c in items]
    assert [x.probs for x in many] == alone
    again = r.ask_many("s", items[1:3] + items[:1])     # a checked shape: not compared again
    assert [x.probs for x in again] == alone[1:3] + alone[:1]
    assert a.graph_stats()["num_question_batches"] == 2 * stats["num_question_batches"]
    r.feed("s", vocab_ids(rng, G), "output")
    assert r.read_batch(["s"]).sessions == ("s",) and r.check_exact("s")
    check_refs(r)


def _two_buckets(tiny, seed: int):
    """A reader on grid 256 (buckets of 64, 128 and 192 rows below it) holding 600 ids, and
    an ask whose last forwards pad to two buckets: a long question (128 rows) beside three
    short ones (64), as the router question beside short classifications."""
    rng = random.Random(seed)
    r = Reader(tiny, grid=256, cuda_graphs=True)
    r.feed("s", vocab_ids(rng, 600), "prompt")
    items = [(vocab_ids(rng, 100), ["a", "b"]), ([5, 6, 7], ["x", "y"]),
             ("Is the user asking for code?", ["yes", "no"]), ([9, 10], ["p", "q", "r"])]
    return r, items


def _ask_steps(r, items, monkeypatch):
    """begin/advance/finish_ask_many of items, recording each fork_logits_batch call's
    buckets; (answers, calls)."""
    a, calls = r.adapter, []
    real = a.fork_logits_batch
    monkeypatch.setattr(a, "fork_logits_batch", lambda items, **kw: calls.append(
        [a.fork_rows(len(i[0])) for i in items]) or real(items, **kw))
    pendings = r.begin_ask_many("s", items)
    while r.advance_many(pendings):
        pass
    return r.finish_ask_many(pendings), calls


def test_questions_of_two_buckets_run_in_one_mixed_forward(tiny, monkeypatch):
    """An ask whose last forwards pad to two buckets: all four in one forward of a mixed
    batch (Runners.mixed_batch: the long question's 128 rows first, then the short ones'),
    whatever the items' order; each answer its question's alone, bit for bit."""
    r, items = _two_buckets(tiny, 8)
    a = r.adapter
    alone = [r.ask("s", q, c).probs for q, c in items]
    pendings = r.begin_ask_many("s", items)
    lengths = [len(p.fw.rest) for p in pendings]
    r.cancel_many(pendings)
    assert [a.fork_rows(n) for n in lengths] == [128, 64, 64, 64] and a.batches(lengths)
    assert a.runners.mixed_batch(lengths).ts == (128, 64, 64, 64)
    got, calls = _ask_steps(r, items, monkeypatch)
    assert calls == [[128, 64, 64, 64]] and [x.probs for x in got] == alone
    stats = a.graph_stats()
    kept = stats["question_batch_bits"]["128+64+64+64"]
    assert stats["num_question_batches"] == int(kept) and \
        "128+64+64+64" in stats["question_batches"]
    if tiny.gemms_keep_tile_bits(5 * 64, 64):      # every row its own GEMM's bits: kept
        assert kept is True
    order = [items[2], items[0], items[3], items[1]]   # the long one second: still one forward
    got, calls = _ask_steps(r, order, monkeypatch)
    assert [x.probs for x in got] == [alone[2], alone[0], alone[3], alone[1]]
    assert calls[-1] == [64, 128, 64, 64]
    assert a.graph_stats()["num_question_batches"] == 2 * int(kept)
    check_refs(r)


def test_questions_of_two_buckets_without_a_mixed_batch_batch_those_of_one(tiny, monkeypatch):
    """Where no mixed batch takes them (more forks than the largest batch, a composition the
    warm-up did not prepare on CUDA: Runners.mixed_rows None), the short ones in one
    forward, the long one alone, one forward a step; each answer its question's alone."""
    r, items = _two_buckets(tiny, 8)
    a = r.adapter
    alone = [r.ask("s", q, c).probs for q, c in items]
    monkeypatch.setattr(a.runners, "mixed_rows", lambda num_rows: None)
    pendings = r.begin_ask_many("s", items)
    lengths = [len(p.fw.rest) for p in pendings]
    r.cancel_many(pendings)
    assert [a.fork_rows(n) for n in lengths] == [128, 64, 64, 64] and not a.batches(lengths)
    got, calls = _ask_steps(r, items, monkeypatch)
    assert calls == [[64, 64, 64], [128]]         # the short ones' step, then the long one's
    stats = a.graph_stats()
    if not tiny.gemms_keep_tile_bits(4 * 64, 64):  # this CPU's GEMMs: a batch checked, refused
        assert stats["question_batch_bits"] == {"4x64": False}
    else:
        assert stats["num_question_batches"] == 1 and stats["question_batches"] == ["4x64"]
    assert [x.probs for x in got] == alone
    check_refs(r)


def _steps(r, items, monkeypatch):
    """begin/advance/finish_ask_many of items, recording each fork_logits_batch call's
    (pos, bucket) pairs and the rows it was told the forks share; returns (answers, calls,
    shared rows per call)."""
    a, calls, shared = r.adapter, [], []
    real = a.fork_logits_batch

    def batch(items, shared_rows=0):
        calls.append([(i[1], a.fork_rows(len(i[0]))) for i in items])
        shared.append(shared_rows)
        return real(items, shared_rows)
    monkeypatch.setattr(a, "fork_logits_batch", batch)
    pendings = r.begin_ask_many("s", items)
    while r.advance_many(pendings):
        pass
    return r.finish_ask_many(pendings), calls, shared


def test_a_steps_batch_holds_forks_of_one_position_and_at_most_the_largest_batch(
        tiny, monkeypatch):
    """Questions that read a grid piece end at another position than the short ones, though
    their last forwards may pad to the same bucket: a step's batch holds one position's (one
    forward a step); a bucket of more questions than the largest batch (8) runs 8 a step."""
    grid, rng = 256, random.Random(9)
    r = Reader(tiny, grid=grid, cuda_graphs=True)
    r.feed("s", vocab_ids(rng, 600), "prompt")
    items = [(vocab_ids(rng, 260), ["a", "b"]), (vocab_ids(rng, 60), ["x", "y"]),
             (vocab_ids(rng, 70), ["p", "q"]), ([3], ["u", "v"])]
    alone = [r.ask("s", q, c).probs for q, c in items]
    got, calls, shared = _steps(r, items, monkeypatch)
    assert [x.probs for x in got] == alone
    assert all(len({pos for pos, _ in call}) == 1 for call in calls) and len(calls) >= 2, calls
    # the forks share their base's rows: the pages below the line (512) and their copies
    # of the tail's page, up to its cut at 576
    assert shared == [576] * len(calls)
    # at 576 the 60 and 70 ids (with the tail's 24) in the 128-row bucket and the 3 ids in
    # the 64-row one together (a mixed batch); the question that read a piece alone at its
    # own position
    assert sorted(len(c) for c in calls) == [1, 3] and \
        [(576, 128), (576, 128), (576, 64)] in calls
    # ten at one position: more than a batch holds, so no mixed batch; the 64-row bucket's
    # first 8 in one forward, then the long one and the last short one (a mixed batch)
    many = [(vocab_ids(rng, 100), ["a", "b"])] + [([5 + i], ["x", "y"]) for i in range(9)]
    alone = [r.ask("s", q, c).probs for q, c in many]
    got, calls, _ = _steps(r, many, monkeypatch)
    assert [x.probs for x in got] == alone
    assert [len(c) for c in calls] == [8, 2] and calls[0][0][1] == 64, calls
    assert sorted(rows for _, rows in calls[1]) == [64, 128]
    check_refs(r)


def test_the_graph_adapter_checks_batch_shapes_on_forks_of_its_own(tiny):
    """check_batches (what the warm-up runs on CUDA, where only shapes checked there are
    batched): a batch of random forks over a scratch pool against each alone, per shape;
    no question counted, the reader's pool untouched."""
    r, _ = _reader(tiny, seed=9, cuda_graphs=True)
    a = r.adapter
    block = r.store.pool.block.clone()
    bits = a.check_batches([(G, 2), (G, 8), (5, 3)])         # 3 forks: the batch of 4
    keep = tiny.gemms_keep_tile_bits(8 * G, G) and tiny.gemms_keep_tile_bits(4 * G, G)
    assert bits == {(2, G): bits[(2, G)], (8, G): keep, (4, G): keep} and len(bits) == 3
    assert a.graph_stats()["num_question_batches"] == 0
    assert torch.equal(r.store.pool.block, block)
    assert a.prepare() is None and a.graph_stats()["question_batch_bits"] == {
        "2x64": bits[(2, G)], "4x64": keep, "8x64": keep}    # the CPU: no shape prepared


def test_a_graph_batch_whose_bits_differ_runs_one_question_at_a_time(tiny, monkeypatch):
    """A shape whose first batch gives a fork other bits than its own runner (here SwiGLU
    over exactly a batch's rows, which every way runs) is recorded and warned of after two
    tries (its first way, then every part one call a fork: the floor); its answers are each
    question's alone, that batch and every later one."""
    import dataclasses
    r, rng = _reader(tiny, n=200, seed=8, cuda_graphs=True)
    items = [([5, 6, 7], ["x", "y"]), ([8, 9, 10, 11, 12], ["p", "q", "r"])]
    alone = [r.ask("s", *item).probs for item in items]
    batch = r.adapter.runners.question_batch(3, 2)
    real, runs, real_run = batch.ops.swiglu, [], batch.run
    monkeypatch.setattr(batch, "run", lambda items, *a: runs.append(batch.calls) or
                        real_run(items, *a))

    def swiglu(g, u):                                  # other bits over exactly 128 rows
        out = real(g, u)
        return out * (1 + 2 ** -6) if g.shape[0] == 2 * G else out
    monkeypatch.setattr(batch, "ops", dataclasses.replace(batch.ops, swiglu=swiglu))
    with pytest.warns(RuntimeWarning, match="other bits than each alone"):
        assert [x.probs for x in r.ask_many("s", items)] == alone
    assert r.adapter.graph_stats()["question_batch_bits"] == {"2x64": False}
    from adapters.runners.batch import PER_FORK
    assert len(runs) == 2 and runs[-1] == PER_FORK               # the first way, the floor
    assert [x.probs for x in r.ask_many("s", items)] == alone
    assert r.adapter.graph_stats()["num_question_batches"] == 0 and len(runs) == 2
    check_refs(r)


def test_a_batch_whose_row_count_changes_the_norms_bits_runs_one_at_a_time(tiny, monkeypatch):
    """The norms over all of a batch's rows (input and post-attention RMSNorm) must give each
    question's rows the bits of the norms over its own rows alone: a machine whose row-wise
    reduction changes with the row count (torch's CUDA reduction picks its launch by the
    tensor's size) at the 128 rows two short questions meet batched gets each answered
    alone, bit for bit as `ask` answers it."""
    from adapters.model import ops
    r, rng = _reader(tiny, n=200, seed=6)
    r.read("s")
    items = [([5, 6, 7], ["x", "y"]), ([8, 9, 10, 11, 12], ["p", "q", "r"])]
    alone = [r.ask("s", *item).probs for item in items]
    real = ops.rms_norm

    def rms_norm(x, w, eps):                  # other bits over exactly 128 rows
        out = real(x, w, eps)
        return out * (1 + 2 ** -6) if x.dim() == 2 and x.shape[0] == 2 * G else out
    monkeypatch.setattr(ops, "rms_norm", rms_norm)
    assert [a.probs for a in r.ask_many("s", items)] == alone


def test_a_batch_whose_one_call_recurrences_differ_runs_them_one_a_fork(tiny, monkeypatch):
    """Where the forks' recurrences in one call (KernelSet.gdn_many) give a fork other bits
    than alone, the check runs the batch again with them one a fork
    (BatchRunner.fall_back): that keeps the bits, so the shape stays batched, with no
    warning, and every answer equals `ask`'s."""
    import dataclasses
    import warnings

    from adapters.model import kernels
    r, rng = _reader(tiny, n=200, seed=5, cuda_graphs=True)
    items = [([5, 6, 7], ["x", "y"]), ([8, 9, 10, 11, 12], ["p", "q", "r"])]
    alone = [r.ask("s", *item).probs for item in items]

    def gdn_many(*args):                               # other bits in one call
        o, s = kernels.gdn_each(tiny.kernels.gdn, *args)
        return o * (1 + 2 ** -6), s
    monkeypatch.setattr(tiny, "kernels", dataclasses.replace(tiny.kernels, gdn_many=gdn_many))
    if not tiny.gemms_keep_tile_bits(2 * G, G):
        pytest.skip("this CPU's GEMMs give a 64-row block other bits in a batch")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert [x.probs for x in r.ask_many("s", items)] == alone
    stats = r.adapter.graph_stats()
    assert stats["question_batch_bits"] == {"2x64": True}
    assert stats["question_batch_one_call"] == {"2x64": {
        "attention": False, "recurrences": False, "conv": False, "rows": False,
        "norms": False, "down": False}}
    assert [x.probs for x in r.ask_many("s", items)] == alone
    assert r.adapter.graph_stats()["num_question_batches"] == 2
    check_refs(r)


def test_a_mixed_batch_whose_warm_up_fails_leaves_its_questions_a_buckets_batch_a_step(
        tiny, monkeypatch):
    """GraphAdapter._prepare_mixed (the warm-up's mixed batches): one checks and keeps its
    bits as the others; one whose warm-up raises is recorded as not batching, with a warning
    naming the error (under its key however its shape was ordered), its runner dropped,
    and the warm-up goes on; that ask's answers are still each question's alone."""
    r, items = _two_buckets(tiny, 8)
    a = r.adapter
    alone = [r.ask("s", q, c).probs for q, c in items]
    a._prepare_mixed([(128, 64)], None)                   # checked on forks of its own
    assert (2, (128, 64)) in a.batch_bits
    batch = a.runners.mixed_batch([100, 3, 3, 3])

    def broken():
        raise RuntimeError("no such kernel")
    monkeypatch.setattr(batch, "prepare", broken)
    with pytest.warns(RuntimeWarning, match=r"128\+64\+64\+64 rows failed its warm-up "
                                            r"\(RuntimeError: no such kernel\)"):
        a._prepare_mixed([(64, 128, 64, 64)], None)
    assert a.batch_bits[(4, (128, 64, 64, 64))] is False and len(a.batch_bits) == 2
    assert "128+64+64+64" not in a.runners.captures()["question_batches"]
    assert "128+64" in a.runners.captures()["question_batches"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")                     # a warm-up again: not made again
        a._prepare_mixed([(128, 64, 64, 64)], None)
    assert "128+64+64+64" not in a.runners.captures()["question_batches"]
    got, calls = _ask_steps(r, items, monkeypatch)
    assert calls == [[64, 64, 64], [128]] and [x.probs for x in got] == alone
    check_refs(r)


def test_questions_that_share_too_few_rows_for_one_fa4_call_run_one_a_step(tiny, monkeypatch):
    """Where a batch's FA4 call would read rows the questions do not share (BatchRunner.shares
    False: forks that read pieces past their base's rows, at a position whose splits reach
    past them), `batches` says so with the shared rows given, so no step runs more than one
    forward: the last forwards go one a step (not all at once in finish_ask_many); each
    answer its question's alone."""
    from adapters.runners.batch import BatchRunner
    r, items = _two_buckets(tiny, 8)
    a = r.adapter
    alone = [r.ask("s", q, c).probs for q, c in items]
    monkeypatch.setattr(BatchRunner, "shares", lambda self, pos, shared_rows: False)
    pendings = r.begin_ask_many("s", items)
    lengths = [len(p.fw.rest) for p in pendings]
    assert a.batches(lengths) and a.batches(lengths, [p.fw.pos for p in pendings])
    assert not a.batches(lengths, [p.fw.pos for p in pendings], pendings[0].fw.base_rows)
    forwards = []
    real_one, real_run = a.fork_logits, BatchRunner.run
    monkeypatch.setattr(a, "fork_logits", lambda *x: forwards.append(1) or real_one(*x))
    monkeypatch.setattr(BatchRunner, "run", lambda self, *x: forwards.append(self.num_seqs)
                        or real_run(self, *x))
    per_step = []
    while r.advance_many(pendings):
        per_step.append(len(forwards))
        forwards.clear()
    got = r.finish_ask_many(pendings)
    per_step.append(len(forwards))
    assert max(per_step) == 1 and sum(per_step) == 4, per_step
    assert [x.probs for x in got] == alone
    check_refs(r)


def test_the_first_forks_of_one_ask_batch_beside_another_asks(tiny, monkeypatch):
    """Questions of two asks begun apart, advanced together, one bucket: the two asks' forks
    share no rows, so where the batch's FA4 call needs shared rows (BatchRunner.shares) no
    batch takes all three, but the first ask's two, which share its base's rows, run in one
    forward (fork.last_group asks about the rows its first k share), then the other; each
    answer its question's alone. (A review found the group's rows, 0, asked for every k.)"""
    from adapters.runners.batch import BatchRunner
    r, items = _two_buckets(tiny, 9)
    short = items[1:]
    alone = [r.ask("s", q, c).probs for q, c in short]
    monkeypatch.setattr(BatchRunner, "shares", lambda self, pos, shared_rows: shared_rows > 0)
    a, calls = r.adapter, []
    real = a.fork_logits_batch
    monkeypatch.setattr(a, "fork_logits_batch", lambda items, **kw: calls.append(
        (len(items), kw["shared_rows"])) or real(items, **kw))
    pendings = r.begin_ask_many("s", short[:2]) + r.begin_ask_many("s", short[2:])
    assert pendings[0].fw.base_rows > 0
    while r.advance_many(pendings):
        pass
    got = r.finish_ask_many(pendings)
    assert calls == [(2, pendings[0].fw.base_rows), (1, pendings[2].fw.base_rows)]
    assert [x.probs for x in got] == alone
    check_refs(r)
