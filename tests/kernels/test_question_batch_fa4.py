"""runners.batch with FA4 (the fp32 fake of flash-attn-4's package, tests/fake_fa4.py,
and the tables kernel in Triton's interpreter on the CPU): the body the CUDA graphs capture,
run eagerly, gives each fork the hidden rows and KV rows its FA4 question runner gives it
alone, at positions with and without FA4's splits; a reader's GraphAdapter on that path checks
its batch shapes and batches asks as the CUDA warm-up leaves it."""
import os

import pytest
import torch
from paged import paged_kv

from adapters.attention import fa4 as attn_fa4
from block_store import PagedKv

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"     # the tables kernel on the CPU
T = 64


@pytest.fixture
def fake_fa4(monkeypatch):
    from fake_fa4 import fake_package
    monkeypatch.setattr(attn_fa4, "available", lambda device, dtype: True)
    return fake_package(monkeypatch)            # MIN_SPLIT_KEYS 256: splits from 512 ids


def _fork_items(spec, base, num_shared: int, num_forks: int, pos: int, g):
    """num_forks forks at pos over base's pool: the pages below pos shared, a page of its
    own each (base.pages[num_shared + b]), random states and ids."""
    forks = []
    for b in range(num_forks):
        kv = PagedKv(base.pool, base.pages[:pos // (2 * T)] + [base.pages[num_shared + b]])
        gdn = [(torch.randn(spec.conv_dim, spec.conv_width, generator=g),
                torch.randn(*spec.recurrent_shape, generator=g) * 0.1)
               for _ in range(spec.num_gdn)]
        forks.append((torch.randint(0, 248000, (T,), generator=g).tolist(), pos, kv, gdn))
    return forks


@pytest.mark.skipif(not INTERPRET, reason="the tiny model on the CPU, Triton interpreted")
def test_fa4_splits_read_every_fork_through_fork_0s_copy_of_a_shared_page(tiny, fake_fa4,
                                                                          monkeypatch):
    """Forks of one session, each on its own copy of the session's partial last page
    (fork.start_many's tail copies), at a position whose splits end inside that page: FA4's
    one call reads every fork's rows there through fork 0's copy, and each fork gets the
    hidden rows and KV rows its runner gives it alone. Forks that share fewer rows than the
    splits read, or other pages below the rows they share, are refused before anything
    runs, and nothing they hold changes."""
    from adapters import spec_for
    from adapters.attention import fa4_plan
    from adapters.runners.runners import Runners
    heads = (tiny.cfg.num_attention_heads, tiny.cfg.num_key_value_heads)
    num_sms = next(n for n in range(1, 999) if fa4_plan.all_splits(T, *heads, n)[-1] == 3)
    monkeypatch.setattr(attn_fa4, "_num_sms", lambda index: num_sms)   # S <= 3: an odd S
    page = 4 * T                  # S Ls, a multiple of 3 * 128, can end inside a page
    runners = Runners(tiny, page, attention="fa4", fused=False)
    alone, batch = runners.for_rows(T), runners.question_batch(T, 3)
    num, cpu = batch.num_seqs, torch.device("cpu")
    # a position inside a page (room for the T question rows) whose splits end above its
    # start: the forks' copies of that page read through fork 0's
    pos = next(p for p in range(page + T, 40 * page, T) if p % page and p % page + T <= page
               and batch._fa4.split_keys(p, T, cpu) > p // page * page)
    line = pos // page * page
    spec = spec_for(tiny.cfg, "cpu", torch.float32)
    base = paged_kv(spec, page, line + (1 + num) * page, seed=7)
    shared, tail, own = (base.pages[:line // page], base.pages[line // page],
                         base.pages[line // page + 1:])
    for b in range(num):                         # each fork's copy of the partial page
        base.pool.copy_page(tail, own[b])
    g = torch.Generator().manual_seed(7)
    forks = [(torch.randint(0, 248000, (T,), generator=g).tolist(), pos,
              PagedKv(base.pool, shared + [own[b]]),
              [(torch.randn(spec.conv_dim, spec.conv_width, generator=g),
                torch.randn(*spec.recurrent_shape, generator=g) * 0.1)
               for _ in range(spec.num_gdn)]) for b in range(num)]
    held = base.pool.block.clone()
    for bad, why in ((line, "the forks share"), (pos + page, "differ from fork 0's")):
        with pytest.raises(ValueError, match=why):
            batch.run(forks, bad)
    assert torch.equal(base.pool.block, held)
    got = batch.run(forks, pos)
    written = [[x[own[b]].clone() for pair in base.pool.layers() for x in pair]
               for b in range(num)]
    for b, (ids, p, kv, gdn) in enumerate(forks):
        want, _ = alone.run(ids, p, kv, gdn)
        assert torch.equal(got[b], want), b
        assert all(torch.equal(x, y) for x, y in zip(
            written[b], [x[own[b]] for pair in base.pool.layers() for x in pair]))


WAY = {"all": {}, "attention": dict(conv=False, rows=False),
       "recurrences": dict(attention=False)}


@pytest.mark.skipif(not INTERPRET, reason="the tiny model on the CPU, Triton interpreted")
@pytest.mark.parametrize("num_forks,calls", [(2, "all"), (4, "all"), (4, "attention"),
                                             (4, "recurrences")])
def test_fa4_batches_give_each_fork_its_runners_bits(tiny, fake_fa4, num_forks, calls):
    """calls "all": every fork's FA4 splits, tails and combine in one call each
    (fa4_graph.attend_many), the recurrences in one, the heads, conv and gates over all rows;
    "attention": the heads, conv and gates one call a fork; "recurrences": FA4 one call a
    fork."""
    from adapters import spec_for
    from adapters.runners.batch import BatchRunner, OneCall
    from adapters.runners.runners import Runners
    runners = Runners(tiny, 2 * T, attention="fa4", fused=False)
    alone, batch = runners.for_rows(T), runners.question_batch(T, num_forks)
    if calls != "all":
        batch = BatchRunner(alone, runners.batch_slots(num_forks), OneCall(**WAY[calls]))
    assert batch.calls.attention == (calls != "recurrences")
    assert batch.calls.conv == batch.calls.rows == (calls != "attention")
    assert alone is not runners.chunk and batch._fa4 is not None
    spec = spec_for(tiny.cfg, "cpu", torch.float32)
    num_shared = 12                                       # 1,536 rows of 128-row pages
    base = paged_kv(spec, 2 * T, (num_shared + num_forks) * 2 * T, seed=num_forks)
    g = torch.Generator().manual_seed(num_forks)
    for pos in (0, 2 * T * 5, 2 * T * num_shared):
        forks = _fork_items(spec, base, num_shared, num_forks, pos, g)
        got = batch.run(forks, pos)                       # the pages below pos shared
        rows = [[x[base.pages[num_shared + b]].clone() for pair in base.pool.layers()
                 for x in pair] for b in range(num_forks)]
        for b, (ids, p, kv, gdn) in enumerate(forks):
            want, _ = alone.run(ids, p, kv, gdn)
            assert torch.equal(got[b], want), (pos, b)
            assert all(torch.equal(x, y) for x, y in zip(
                rows[b], [x[base.pages[num_shared + b]] for pair in base.pool.layers()
                          for x in pair]))
    assert sorted(s for _, s in batch._tables_by_s) == sorted(
        {attn_fa4.FA4Attention(tiny.cfg.num_attention_heads, tiny.cfg.num_key_value_heads)
         .num_splits(p, T, torch.device("cpu")) for p in (0, 640, 1536)})
    assert len(batch._tables_by_s) >= 2                   # without splits and with


@pytest.mark.skipif(not INTERPRET, reason="the tiny model on the CPU, Triton interpreted")
@pytest.mark.parametrize("calls", ["all", "per_fork"])
def test_a_mixed_fa4_batch_gives_each_fork_its_own_buckets_bits(tiny, fake_fa4, calls):
    """A mixed batch (Runners.mixed_batch): a 128-row question beside two 64-row ones at one
    position, each bucket with its own FA4 split count (the 128-row group's splits and tail
    through its own tables, alone in its group; the 64-row pair's through attend_many), the
    conv and recurrences a group, the rest over all 256 rows; each fork gets the hidden rows
    and KV rows its own bucket's runner gives it alone, at positions without splits and with
    other split counts for the two buckets."""
    from adapters import spec_for
    from adapters.runners.batch import PER_FORK
    from adapters.runners.runners import Runners
    page = 4 * T
    runners = Runners(tiny, page, attention="fa4", fused=False)
    batch = runners.mixed_batch([100, 30, 40])
    assert batch.ts == (2 * T, T, T) and batch.t is None and batch.key == (3, (2 * T, T, T))
    assert runners.mixed_order([30, 100, 40]) == [1, 0, 2]
    assert runners.mixed_batch([30, 40]) is None            # one bucket: question_batch's
    if calls == "per_fork":
        batch.use(PER_FORK)
    # positions (multiples of the page) where the buckets' split counts differ, and one with
    # none
    differ = [p for p in range(page, 64 * page, page)
              if len(set(batch.splits(p))) == 2 and min(batch.splits(p)) > 0]
    positions = [0, differ[0], differ[-1]]
    spec = spec_for(tiny.cfg, "cpu", torch.float32)
    num_shared = positions[-1] // page
    base = paged_kv(spec, page, (num_shared + 3) * page, seed=5)
    g = torch.Generator().manual_seed(5)
    for pos in positions:
        forks = []
        for b, t in enumerate(batch.ts):
            kv = PagedKv(base.pool, base.pages[:pos // page] + [base.pages[num_shared + b]])
            gdn = [(torch.randn(spec.conv_dim, spec.conv_width, generator=g),
                    torch.randn(*spec.recurrent_shape, generator=g) * 0.1)
                   for _ in range(spec.num_gdn)]
            forks.append((torch.randint(0, 248000, (t,), generator=g).tolist(), pos, kv, gdn))
        got = batch.run(forks, pos)
        rows = [[x[base.pages[num_shared + b]].clone() for pair in base.pool.layers()
                 for x in pair] for b in range(3)]
        for b, (ids, p, kv, gdn) in enumerate(forks):
            want, _ = runners.for_rows(len(ids)).run(ids, p, kv, gdn)
            assert got[b].shape == want.shape and torch.equal(got[b], want), (pos, b)
            assert all(torch.equal(x, y) for x, y in zip(
                rows[b], [x[base.pages[num_shared + b]] for pair in base.pool.layers()
                          for x in pair]))
    assert {s for (gi, s) in batch._tables_by_s if gi == 0} != \
        {s for (gi, s) in batch._tables_by_s if gi == 1}      # each group its own counts


@pytest.mark.skipif(not INTERPRET, reason="the tiny model on the CPU, Triton interpreted")
def test_a_mixed_batch_of_lone_forks_needs_no_shared_rows(tiny, fake_fa4):
    """A mixed batch whose buckets hold one fork each runs FA4 a fork through its own pages
    (fa4_graph.attend), so forks that share no rows at all (other pages, other keys below
    their position, where FA4 splits them) run in it, each with its own bucket's runner's
    bits (BatchRunner.shares); a bucket of two forks reads through its first fork's pages,
    so that batch asks for the shared rows its splits read."""
    from adapters import spec_for
    from adapters.runners.runners import Runners
    page = 4 * T
    runners = Runners(tiny, page, attention="fa4", fused=False)
    lone, pair = runners.mixed_batch([100, 30]), runners.mixed_batch([100, 30, 40])
    pos = next(p for p in range(page, 64 * page, page) if min(lone.splits(p)) > 1)
    assert lone.shares(pos, 0) and not pair.shares(pos, 0) and pair.shares(pos, pos)
    spec = spec_for(tiny.cfg, "cpu", torch.float32)
    num = pos // page
    base = paged_kv(spec, page, (2 * num + 2) * page, seed=9)
    g = torch.Generator().manual_seed(9)
    forks = []
    for b, t in enumerate(lone.ts):              # fork b: pages of its own, other keys
        kv = PagedKv(base.pool, base.pages[b * num:(b + 1) * num] + [base.pages[2 * num + b]])
        gdn = [(torch.randn(spec.conv_dim, spec.conv_width, generator=g),
                torch.randn(*spec.recurrent_shape, generator=g) * 0.1)
               for _ in range(spec.num_gdn)]
        forks.append((torch.randint(0, 248000, (t,), generator=g).tolist(), pos, kv, gdn))
    got = lone.run(forks, 0)
    for b, (ids, p, kv, gdn) in enumerate(forks):
        want, _ = runners.for_rows(len(ids)).run(ids, p, kv, gdn)
        assert torch.equal(got[b], want), b


@pytest.mark.skipif(not INTERPRET, reason="the tiny model on the CPU, Triton interpreted")
def test_a_reader_on_fa4_checks_its_shapes_and_batches_its_asks(tiny, fake_fa4):
    import random

    from helpers import vocab_ids

    from shadow_plugin import Reader
    rng = random.Random(3)
    r = Reader(tiny, grid=2 * T, cuda_graphs=True, attention="fa4", fused_ops=False)
    a = r.adapter
    assert a.batches() and a.check_batches([(T, 2)]) == {(2, T): True}
    r.feed("s", vocab_ids(rng, 9 * T + 10), "prompt")
    r.read("s")
    items = [([5, 6, 7], ["x", "y"]), (vocab_ids(rng, 20), ["p", "q", "r"])]
    many = r.ask_many("s", items)
    assert a.graph_stats()["num_question_batches"] == 1
    assert [x.probs for x in many] == [r.ask("s", *item).probs for item in items]
    assert r.check_exact("s")


@pytest.mark.skipif(not INTERPRET, reason="the tiny model on the CPU, Triton interpreted")
@pytest.mark.parametrize("broken,way", [
    ("attention", dict(attention=False)),
    ("recurrences", dict(recurrences=False, conv=False, rows=False)),
    ("conv", dict(conv=False, rows=False)),
    ("heads", dict(rows=False))])
def test_a_part_whose_one_call_differs_runs_one_call_a_fork(tiny, fake_fa4, monkeypatch,
                                                            broken, way):
    """The check's ways (OneCall.fallback): where FA4 in one call (attend_many), the
    recurrences' one call, the conv's one call or the heads over all rows (the rows part)
    give fork 1 other bits, the shape takes the first way without that part. Either way the
    shape stays batched, with no warning."""
    import dataclasses
    import warnings

    from adapters.model import kernels
    from adapters.runners import fa4_graph
    from adapters.runners.batch import OneCall
    from shadow_plugin import Reader
    if broken == "attention":
        real = fa4_graph.attend_many

        def attend_many(fwd, q, k, v, tables, out, side=None):
            real(fwd, q, k, v, tables, out, side)
            out[T] += 1e-3                                 # fork 1's first row off
        monkeypatch.setattr(fa4_graph, "attend_many", attend_many)
    elif broken == "heads":
        from adapters.model import layers
        real_heads = layers.Attention.heads

        def heads(self, qg, k, v, rope, op=None):
            q, k, v, gate = real_heads(self, qg, k, v, rope, op)
            if q.shape[0] > T:                             # over all rows: fork 1's row off
                q = q.clone()
                q[T] += 1e-3
            return q, k, v, gate
        monkeypatch.setattr(layers.Attention, "heads", heads)
    else:                            # the recurrences' or the conv's one call over [B, t]
        each, one = {"recurrences": (kernels.gdn_each, tiny.kernels.gdn),
                     "conv": (kernels.conv_each, tiny.kernels.conv)}[broken]

        def many(*args):
            out, state = each(one, *args)
            out[1, 0] += 1e-3                              # fork 1's first row off
            return out, state
        field = "gdn_many" if broken == "recurrences" else "conv_many"
        monkeypatch.setattr(tiny, "kernels", dataclasses.replace(tiny.kernels, **{field: many}))
    r = Reader(tiny, grid=2 * T, cuda_graphs=True, attention="fa4", fused_ops=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert r.adapter.check_batches([(T, 2)]) == {(2, T): True}
    assert r.adapter.graph_stats()["question_batch_one_call"] == {
        "2x64": dataclasses.asdict(OneCall(**way))}


@pytest.mark.skipif(not INTERPRET, reason="the tiny model on the CPU, Triton interpreted")
def test_a_chunk_batch_on_fa4_gives_each_session_its_chunk_runners_bits(tiny, fake_fa4,
                                                                       monkeypatch):
    """Runners.chunk_batch with FA4 (the body its CUDA graphs capture, eagerly): grid chunks
    of four sessions at their own positions of one split count, FA4 one call a chunk over its
    own tables, give each the hidden rows, KV rows and GDN states the chunk runner gives it
    alone; chunks at positions of other split counts are refused before anything runs."""
    from adapters import spec_for
    from adapters.attention import fa4_plan
    from adapters.runners.runners import Runners
    grid = 2 * T
    heads = (tiny.cfg.num_attention_heads, tiny.cfg.num_key_value_heads)
    num_sms = next(n for n in range(1, 999) if fa4_plan.all_splits(grid, *heads, n)[-1] == 2)
    monkeypatch.setattr(attn_fa4, "_num_sms", lambda index: num_sms)   # S = 2 from 512 on
    runners = Runners(tiny, grid, attention="fa4", fused=False)
    batch = runners.chunk_batch(4)
    positions = [512, 768, 1152, 1408]
    assert {batch.splits(p) for p in positions} == {2} and batch.splits(grid) == 0
    spec = spec_for(tiny.cfg, "cpu", torch.float32)
    need = [p // grid + 1 for p in positions]
    base = paged_kv(spec, grid, grid * sum(need), seed=11)
    g = torch.Generator().manual_seed(11)
    items, at = [], 0
    for pos, n in zip(positions, need):
        kv = PagedKv(base.pool, base.pages[at:at + n])
        at += n
        gdn = [(torch.randn(spec.conv_dim, spec.conv_width, generator=g),
                torch.randn(*spec.recurrent_shape, generator=g) * 0.1)
               for _ in range(spec.num_gdn)]
        items.append((torch.randint(0, 248000, (grid,), generator=g).tolist(), pos, kv, gdn))
    held = base.pool.block.clone()
    with pytest.raises(ValueError, match="one FA4 split count"):
        batch.read(items[:3] + [(items[3][0], grid, items[3][2], items[3][3])])
    assert torch.equal(base.pool.block, held)
    got = batch.read(items)
    written = [[x[kv.pages[-1]].clone() for pair in base.pool.layers() for x in pair]
               for _, _, kv, _ in items]
    for (ids, pos, kv, gdn), (h, states), rows in zip(items, got, written):
        want_h, want_states = runners.chunk.run(ids, pos, kv, gdn)
        assert torch.equal(h, want_h), pos
        assert all(torch.equal(a, c) and torch.equal(b, d)
                   for (a, b), (c, d) in zip(states, want_states)), pos
        assert all(torch.equal(x, y) for x, y in zip(
            rows, [x[kv.pages[-1]] for pair in base.pool.layers() for x in pair])), pos


@pytest.mark.skipif(not INTERPRET, reason="the tiny model on the CPU, Triton interpreted")
def test_forks_of_two_asks_share_nothing_across_a_rewrite(tiny, fake_fa4, monkeypatch):
    """Forks begun by two begin_ask_many calls at one `at` of one session, a rewrite of the
    tail's ids between them, finished together: they stand on other rows below the cut, so
    they share none (Forward.origin), no batch with one FA4 call takes both
    (Adapter.batches), each runs alone, a step each, with its own ask's rows, and each
    answer equals `ask`'s; forks of one call share the rows up to the cut. (A review found
    the first case read fork 1's tail rows through fork 0's copy when forks were matched by
    session and place.)"""
    import random

    from helpers import vocab_ids

    from adapters.attention import fa4_plan
    from shadow_plugin import Reader
    heads = (tiny.cfg.num_attention_heads, tiny.cfg.num_key_value_heads)
    num_sms = next(n for n in range(1, 999) if fa4_plan.all_splits(T, *heads, n)[-1] == 3)
    monkeypatch.setattr(attn_fa4, "_num_sms", lambda index: num_sms)
    grid, at = 4 * T, 1160                   # line 1024, cut 1152 = S Ls (S = 3, Ls = 384)
    r = Reader(tiny, grid=grid, cuda_graphs=True, attention="fa4", fused_ops=False)
    a = r.adapter
    assert a.runners.question_batch(T, 2)._fa4.split_keys(1152, T, torch.device("cpu")) == 1152
    assert a.check_batches([(T, 2)]) == {(2, T): True}
    rng = random.Random(1)
    ids = vocab_ids(rng, 1200)
    r.feed("s", ids, "prompt")
    r.read("s")
    q = ([5, 6, 7], ["x", "y"])
    want1 = r.ask("s", *q, at=at).probs
    shared = []
    real = a.fork_logits_batch
    monkeypatch.setattr(a, "fork_logits_batch", lambda items, shared_rows=0:
                        shared.append(shared_rows) or real(items, shared_rows))
    assert [x.probs for x in r.ask_many("s", [q, q], at=at)] == [want1] * 2
    assert shared == [1152]                  # one ask: its forks share rows up to the cut
    first = r.begin_ask_many("s", [q], at=at)
    r.feed("s", ids[:1100] + vocab_ids(rng, 100), "prompt")       # rewrites [1100, 1152)
    second = r.begin_ask_many("s", [q], at=at)
    both = first + second
    while r.advance_many(both):
        pass
    got = r.finish_ask_many(both)
    monkeypatch.setattr(a, "fork_logits_batch", real)
    assert shared[1:] == [1152, 1152] and got[0].probs == want1   # one fork a forward
    assert got[1].probs == r.ask("s", *q, at=at).probs != want1


@pytest.mark.skipif(not INTERPRET, reason="the tiny model on the CPU, Triton interpreted")
def test_a_chunk_batch_never_runs_fa4_in_one_call(tiny, fake_fa4):
    """Chunks at positions of their own read other split tables: a chunk batch turns FA4 in
    one call off whatever way it is told to run (the constructor's or `use`'s)."""
    from adapters.runners.batch import ALL_IN_ONE, BatchRunner
    from adapters.runners.runners import Runners
    runners = Runners(tiny, 2 * T, attention="fa4", fused=False)
    batch = runners.chunk_batch(2)
    batch.use(ALL_IN_ONE)
    assert not batch.calls.attention and batch.calls.recurrences
    own = BatchRunner(runners.chunk, runners.chunk_slots(2), ALL_IN_ONE, one_position=False)
    assert not own.calls.attention
    assert runners.question_batch(T, 2).calls.attention       # one position: FA4 in one call
