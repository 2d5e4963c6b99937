"""FA4 inside the chunk's one CUDA graph (runners.fa4_graph): the tables the device builds
against their twin and against the eager path's plan (fa4_plan.plan_into), the runner's body
over them against the segmented body with FA4 between graphs (the fp32 fake of
test_attn_fa4 on the CPU; the real kernels, captured, on a Hopper GPU), and the graphs kept
per number of splits and KV pool."""
from __future__ import annotations

import os
import random
import types

import numpy as np
import pytest
import torch
from paged import kv_rows, run_chunks

from adapters.attention import fa4 as attn_fa4
from adapters.attention import fa4_plan
from adapters.runners import fa4_graph, graphs

HOPPER_FA4 = torch.cuda.is_available() and attn_fa4.available(torch.device("cuda"),
                                                              torch.bfloat16)
# the tables' kernel on the CPU runs in Triton's interpreter (tests/conftest.py sets it; a GPU
# run with TRITON_INTERPRET=0 runs it on the GPU instead)
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEV = torch.device("cpu" if INTERPRET or not torch.cuda.is_available() else "cuda")
pytestmark = pytest.mark.skipif(not INTERPRET and not torch.cuda.is_available(),
                                reason="Triton's interpreter on the CPU, or a GPU")


def _meta(pos: int, pages, table_at: int = 9) -> torch.Tensor:
    meta = torch.full((table_at + graphs.MAX_TABLE_PAGES,), -1, dtype=torch.long)
    meta[3] = pos
    meta[table_at:table_at + len(pages)] = torch.tensor(pages)
    return meta.to(DEV)


@pytest.mark.parametrize("page_rows,t", [(512, 512), (128, 64), (192, 128), (512, 256)])
def test_device_tables_equal_the_twin_and_the_eager_plan(page_rows, t):
    """SplitTables.fill (Triton's interpreter) writes the twin's entries and key counts, the
    same sub-pages as the eager path's plan, and nothing past a row's count."""
    rng = random.Random(page_rows + t)
    sizes = [rng.randrange(1, 60) for _ in range(8)] + [graphs.MAX_TABLE_PAGES]
    seen = set()
    for n in sizes:
        if n * page_rows < t:
            continue
        pages = rng.sample(range(5 * n), n)
        pos = 64 * rng.randrange(0, (n * page_rows - t) // 64 + 1)
        s, ls = fa4_plan.split_plan(pos, t, 8, 2, 132)
        seen.add(s > 0)
        tables = fa4_graph.SplitTables(s, t, graphs.MAX_TABLE_PAGES * page_rows, DEV)
        for x in (tables.split, tables.split_len, tables.tail, tables.tail_len):
            if x is not None:
                x.fill_(-7)
        tables.fill(_meta(pos, pages), 3, 9, page_rows)
        want = fa4_graph.tables_ref(s, pos, t, pages, page_rows)
        host = np.zeros(fa4_plan.plan_size(pos + t, page_rows), dtype=np.int32)
        plan, _ = fa4_plan.plan_into(pos, t, (8, 2), 132, np.asarray(pages), page_rows, host,
                                     torch.from_numpy(host))
        tables = types.SimpleNamespace(**{k: None if x is None else x.cpu()
                                          for k, x in vars(tables).items()
                                          if isinstance(x, torch.Tensor) or x is None})
        w = want["tail"].shape[1]
        assert torch.equal(tables.tail[:, :w].long(), want["tail"])
        assert torch.equal(plan.tail.long(), want["tail"])
        assert (tables.tail[:, w:] == -7).all()
        assert tables.tail_len.tolist() == want["tail_len"].tolist() == [pos + t - s * ls]
        if s:
            w = want["split"].shape[1]
            assert torch.equal(tables.split[:, :w].long(), want["split"])
            assert torch.equal(plan.split.long(), want["split"])
            assert (tables.split[:, w:] == -7).all()
            assert tables.split_len.tolist() == [ls] * s
    assert seen == {True, False}


@pytest.mark.parametrize("s", [0, 3])
def test_batch_tables_hold_each_forks_tail_in_its_row(s):
    """BatchTables: the forks' SplitTables filled one at a time (each the twin's entries,
    tables_ref) and gathered leave fork b's tail in row b of the batch's tail table, its key
    count at tail_len[b]; the splits stay in each fork's own tables."""
    rng = random.Random(s)
    page_rows, t, num = 128, 64, 3
    max_rows = graphs.MAX_TABLE_PAGES * page_rows
    batch = fa4_graph.BatchTables(s, t, max_rows, DEV, num)
    pos = 64 * 40 if s else 64 * 3
    wants = []
    for b, tables in enumerate(batch.forks):
        pages = rng.sample(range(400), pos // page_rows + 1)
        tables.fill(_meta(pos, pages), 3, 9, page_rows)
        wants.append(fa4_graph.tables_ref(s, pos, t, pages, page_rows))
    batch.gather()
    for b, want in enumerate(wants):
        w = want["tail"].shape[1]
        assert torch.equal(batch.tail[b:b + 1, :w].cpu().long(), want["tail"])
        assert batch.tail_len[b].item() == want["tail_len"].item()
        fork = batch.forks[b]
        for i in range(s):
            w = want["split"].shape[1]
            assert torch.equal(fork.split[i, :w].cpu().long(), want["split"][i])
        assert fork.split is None if s == 0 else fork.split_len.tolist() == \
            want["split_len"].tolist()
    assert batch.tail.shape[0] == num and not hasattr(batch, "split")


@pytest.mark.parametrize("heads,num_sms", [((8, 2), 132), ((16, 2), 132), ((8, 8), 78),
                                           ((32, 4), 2000)])
def test_table_widths_hold_every_position(heads, num_sms):
    """A split's row holds the keys of any chunk ending at or below max_rows, the tail's the
    rest (a reviewer's brute force over 7.1M cases found none over: this samples it)."""
    for t in (64, 256, 512, 1024):
        for max_rows in (40000, 40000 + 64 * 7):
            for pos in range(0, max_rows - t + 1, 64):
                s, ls = fa4_plan.split_plan(pos, t, *heads, num_sms)
                w_split, w_tail = fa4_graph.widths(s, t, max_rows)
                assert ls // 64 <= w_split and (pos + t - s * ls) // 64 <= w_tail


def test_all_splits_are_every_split_the_plan_gives():
    """fa4_plan.all_splits lists exactly the S split_plan gives over every position (the
    warm-up runs each, runners.capture.warm_positions, so no capture compiles)."""
    for t in (64, 256, 512, 768, 1024, 2048):
        for sms in (78, 114, 132):
            seen = {fa4_plan.split_plan(pos, t, 8, 2, sms)[0]
                    for pos in range(0, 80 * fa4_plan.MIN_SPLIT_KEYS, 64)}
            assert sorted(seen) == fa4_plan.all_splits(t, 8, 2, sms), (t, sms)
            for s in fa4_plan.all_splits(t, 8, 2, sms):     # the warm-up's position for S
                assert fa4_plan.split_plan(s * fa4_plan.MIN_SPLIT_KEYS, t, 8, 2, sms)[0] == s


class _Graph:
    def __init__(self):
        self.num_replays = 0

    def replay(self):
        self.num_replays += 1


def test_split_graphs_capture_once_per_split_and_pool(monkeypatch):
    """One capture per number of splits over a pool; a pool that grew (new pointers) or
    another pool gets a new capture; the pinned pool's graphs are kept whatever comes, and
    those of the MAX_OTHER_POOLS other pools used last; each replay points the slots at its
    graph's states."""
    sg = fa4_graph.SplitGraphs(512, 512 * 64, torch.device("cpu"))
    made = []

    def capture(pool, body, slots):
        made.append(pool.pointers)
        return pool.pointers, _Graph(), [("conv", len(made))]

    monkeypatch.setattr(sg, "_capture", capture)
    slots = types.SimpleNamespace(outputs=[None])
    ns = types.SimpleNamespace
    reader, a, b = ns(pointers=[1, 2]), ns(pointers=[1, 2]), ns(pointers=[3, 4])
    sg.pin(reader)
    for s in (0, 0, 2, 2, 0):
        sg.replay(s, reader, None, slots)
    assert len(made) == 2 and slots.outputs == [("conv", 1)]
    assert sorted(e[1].num_replays for e in sg.graphs.values()) == [2, 3]
    sg.replay(2, a, None, slots)                 # equal addresses, another list: captured
    assert len(made) == 3 and slots.outputs == [("conv", 3)]
    sg.replay(2, b, None, slots)                 # a third pool evicts a's, not the reader's
    sg.replay(0, reader, None, slots)
    sg.replay(2, b, None, slots)
    assert len(made) == 4 and slots.outputs == [("conv", 4)]
    assert {id(e[0]) for e in sg.graphs.values()} == {id(reader.pointers), id(b.pointers)}
    old = reader.pointers
    reader.pointers = [5, 6]                      # KvPool.grow replaces the list: still pinned
    sg.replay(0, reader, None, slots)
    sg.replay(2, a, None, slots)
    assert len(made) == 6
    kept = {id(e[0]) for e in sg.graphs.values()}
    assert id(reader.pointers) in kept and id(a.pointers) in kept and id(b.pointers) not in kept
    assert id(old) not in kept                    # the old memory's: another pool now
    assert len(sg.all()) == len(sg.graphs)


def test_a_failed_capture_runs_eagerly_and_is_not_tried_again(monkeypatch):
    sg = fa4_graph.SplitGraphs(512, 512 * 64, torch.device("cpu"))
    tries, bodies = [], []

    def capture(pool, body, slots):
        tries.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(sg, "_capture", capture)
    pool = types.SimpleNamespace(pointers=[1])
    slots = types.SimpleNamespace(outputs=["before"])
    with pytest.warns(RuntimeWarning, match="2 FA4 splits could not be captured.*not permitted"):
        sg.replay(2, pool, lambda: bodies.append(1), slots)
    sg.replay(2, pool, lambda: bodies.append(1), slots)
    assert tries == [1] and bodies == [1, 1] and sg.num_failed_captures == 1
    assert sg.all() == [] and slots.outputs == ["before"]     # the body sets its own outputs




@pytest.mark.skipif(not INTERPRET, reason="the tiny model on the CPU, Triton interpreted")
def test_the_graph_body_gives_the_segmented_bits(tiny, monkeypatch):
    """The body over the device-built tables (eager on the CPU, FA4 the fp32 fake) gives the
    segmented body's bits over chunks with and without splits, for pages anywhere."""
    from fake_fa4 import fake_package
    from paged import paged_kv

    from adapters import spec_for
    monkeypatch.setattr(attn_fa4, "available", lambda device, dtype: True)
    fake_package(monkeypatch)
    t, num_chunks = 64, 12
    ids = torch.randint(0, 248000, (num_chunks * t,),
                        generator=torch.Generator().manual_seed(4)).tolist()
    spec = spec_for(tiny.cfg, "cpu", torch.float32)
    runs = {}
    for in_graph, seed in ((True, 0), (False, 0), (True, 5)):
        runner = graphs.ChunkGraphs(tiny, t, attention="fa4", fused=False, page_rows=64,
                                    fa4_in_graph=in_graph)
        kv = paged_kv(spec, 64, num_chunks * t, seed=seed)
        runs[in_graph, seed] = (*run_chunks(tiny, runner, kv, ids, t),
                                kv_rows(kv, num_chunks * t), runner)
    splits = {runs[True, 0][3]._between.num_splits(p, t, torch.device("cpu"))
              for p in range(0, num_chunks * t, t)}
    assert 0 in splits and len(splits) >= 2
    assert sorted(runs[True, 0][3].split_graphs.tables) == sorted(splits)
    for other in ((False, 0), (True, 5)):
        assert all(torch.equal(a, b) for a, b in zip(runs[True, 0][0], runs[other][0]))
        assert all(torch.equal(a, b) for pair_a, pair_b in zip(runs[True, 0][1], runs[other][1])
                   for a, b in zip(pair_a, pair_b))
        assert all(torch.equal(a, b) for a, b in zip(runs[True, 0][2], runs[other][2]))


def test_warm_up_hands_the_readers_pool_to_the_adapter(tiny, monkeypatch):
    """Reader.warm_up passes its KV pool down, so runners with FA4 in the graph capture over
    it before the first chunk (runners.capture.capture_splits), and the rows of every tail a
    fork can cut (fork.tail_rows), so their states-keeping runners are captured then too."""
    from shadow_plugin.reader import fork
    from shadow_plugin.reader.reader import Reader
    seen = []
    for grid in (64, 256):
        reader = Reader(tiny, grid=grid)
        monkeypatch.setattr(reader.adapter, "prepare",
                            lambda pool=None, kept_rows=(), chunk_batches=():
                            seen.append((pool, kept_rows, list(chunk_batches))))
        reader.warm_up()
        assert seen[-1] == (reader.table.store.pool, fork.tail_rows(grid), [])
        assert seen[-1][0] is not None
    assert [rows for _, rows, _ in seen] == [[], [64, 128, 192]]
    reader.warm_up(batch_sessions=4)                 # the read batches of 2 to 4 sessions
    assert seen[-1][2] == [2, 3, 4]


def test_split_graphs_of_a_question_runner_keep_no_states(monkeypatch):
    """With slots that return no states, a capture keeps no output states and lets go of the
    slots' (their blocks go back to the graphs' pool); its replays leave the slots alone."""
    from adapters.runners import capture
    from adapters.runners.slots import StateSlots
    sg = fa4_graph.SplitGraphs(64, 512 * 64, torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    cfg = types.SimpleNamespace(linear_num_value_heads=2, linear_key_head_dim=4,
                                linear_value_head_dim=4, conv_dim=8, linear_conv_kernel_dim=4,
                                linear_layers=[0, 1])
    pool = types.SimpleNamespace(pointers=[1])
    for returned in (True, False):
        slots = StateSlots(cfg, "cpu", torch.float32, returned=returned)
        states = [(torch.ones(1), torch.ones(1)), (torch.ones(1), torch.ones(1))]

        def body():
            slots.outputs[:] = states
        monkeypatch.setattr(capture, "graph_of", lambda body, mempool: (body(), _Graph())[1])
        entry = sg.ensure(2 + returned, pool, body, slots)
        if returned:
            assert entry[2] == states and slots.outputs == states
        else:
            assert entry[2] is None and slots.outputs == [None, None]
            sg.replay(2, pool, body, slots)
            assert entry[1].num_replays == 1 and slots.outputs == [None, None]


def test_a_runners_warm_ups_run_on_one_side_stream(tiny, monkeypatch):
    """capture.capture warms up at every split's position on the runner's one side stream
    (made at the first warm-up when it has none, kept after; given, none is made): cuBLAS
    keeps a workspace for every stream it ran on."""
    from adapters.runners import capture
    made, seen = [], []
    monkeypatch.setattr(capture, "new_side_stream",
                        lambda device: made.append(object()) or made[-1])
    monkeypatch.setattr(capture, "warm_up",
                        lambda runner, kv, pos: seen.append((pos, capture.side_stream(runner))))
    between = types.SimpleNamespace(all_splits=lambda t, device: [0, 2, 3])
    runner = types.SimpleNamespace(model=tiny, t=64, page_rows=64, attention="fa4",
                                   split_graphs=True, _between=between, side_stream=None)
    capture.capture(runner)
    capture.capture(runner)
    assert len(made) == 1 and runner.side_stream is made[0]
    assert seen == [(p, made[0]) for p in (0, 2048, 3072)] * 2
    given = types.SimpleNamespace(**{**vars(runner), "side_stream": "s"})
    seen.clear()
    capture.capture(given)
    assert len(made) == 1 and [s for _, s in seen] == ["s"] * 3


def test_a_warm_up_runs_the_body_on_the_side_stream_then_releases_states(monkeypatch):
    """capture.warm_up: the body twice inside the runner's side stream, ordered after the
    current stream's work and before its next; then the slots let go of their states."""
    from adapters.runners import capture
    events = []

    class Stream:
        def __init__(self, name):
            self.name = name

        def wait_stream(self, other):
            events.append(f"{self.name} waits {other.name}")

    side, current = Stream("side"), Stream("current")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: current)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("sync"))

    class On:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            events.append(f"on {self.stream.name}")

        def __exit__(self, *exc):
            events.append("off")
    monkeypatch.setattr(torch.cuda, "stream", On)
    slots = types.SimpleNamespace(release=lambda: events.append("release"))
    runner = types.SimpleNamespace(t=2, model=types.SimpleNamespace(device="cuda"),
                                   side_stream=side, slots=slots,
                                   _stage=lambda ids, pos, kv: events.append(f"stage {pos}"),
                                   _body=lambda: events.append("body"))
    capture.warm_up(runner, "kv", 1024)
    assert events == ["stage 1024", "side waits current", "on side", "body", "body", "off",
                      "current waits side", "sync", "release"]
    assert runner._kv is None and runner._pos == 1024


def test_runners_share_one_side_stream(tiny, monkeypatch):
    """Every runner a Runners makes (chunk, question buckets, decode) warms up on the one
    stream it made (runners.capture.new_side_stream: None on the CPU)."""
    from adapters.runners import capture
    from adapters.runners.runners import Runners
    assert Runners(tiny, 512).chunk.side_stream is None
    monkeypatch.setattr(capture, "new_side_stream", lambda device: "the stream")
    r = Runners(tiny, 512)
    runners = [r.chunk, r.for_rows(40), r.for_rows(100), r.for_rows(600), r.decode()]
    assert len({id(x) for x in runners}) == 5
    assert all(x.side_stream == "the stream" for x in runners)


def test_without_a_pinned_pool_two_pools_are_kept(monkeypatch):
    """A reader that skipped its warm-up: its pool and check_exact's fresh pools, in turns,
    cost one capture per fresh pool, not one for the reader's pool each time too."""
    sg = fa4_graph.SplitGraphs(512, 512 * 64, torch.device("cpu"))
    made = []
    monkeypatch.setattr(sg, "_capture", lambda pool, body, slots: (
        made.append(1), (pool.pointers, _Graph(), []))[1])
    reader, slots = types.SimpleNamespace(pointers=[1]), types.SimpleNamespace(outputs=[])
    for round_ in range(3):
        sg.replay(4, reader, None, slots)
        sg.replay(4, types.SimpleNamespace(pointers=[9]), None, slots)   # a fresh pool
    assert len(made) == 1 + 3


def test_runners_pin_the_readers_pool_in_runners_made_later(tiny, monkeypatch):
    """Question runners made after the warm-up keep their graphs over the reader's pool."""
    from adapters.runners.runners import Runners
    monkeypatch.setattr(attn_fa4, "available", lambda device, dtype: True)
    monkeypatch.setattr(attn_fa4, "_num_sms", lambda index: 132)
    runners = Runners(tiny, 64, attention="fa4", fused=False)
    pool = types.SimpleNamespace(pointers=[1, 2])
    runners.prepare(question_rows=[64], pool=pool)
    later = runners.for_rows(3 * Runners.BUCKET)
    assert later.split_graphs is not None and later.split_graphs._pinned is pool
    assert runners.chunk.split_graphs._pinned is None       # no graphs on the CPU: no capture
