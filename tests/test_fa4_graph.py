"""FA4 inside the chunk's one CUDA graph (model.fa4_graph): the tables the device builds
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

from adapters.model import attn_fa4, fa4_graph, fa4_plan, graphs

HOPPER_FA4 = torch.cuda.is_available() and attn_fa4.available(torch.device("cuda"),
                                                              torch.bfloat16)
# the tables' kernel on the CPU runs in Triton's interpreter (tests/conftest.py sets it; a GPU
# run with TRITON_INTERPRET=0 runs it on the GPU instead)
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEV = torch.device("cpu" if INTERPRET or not torch.cuda.is_available() else "cuda")


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


def test_table_widths_hold_every_position():
    """A split's row holds the keys of any position below max_rows, the tail's the rest."""
    for t in (64, 256, 512):
        for pos in range(0, 40000 - t, 64):
            s, ls = fa4_plan.split_plan(pos, t, 8, 2, 132)
            w_split, w_tail = fa4_graph.widths(s, t, 40000)
            assert ls // 64 <= w_split and (pos + t - s * ls) // 64 <= w_tail


class _Graph:
    def __init__(self):
        self.num_replays = 0

    def replay(self):
        self.num_replays += 1


def test_split_graphs_capture_once_per_split_and_pool(monkeypatch):
    """One capture per number of splits over a pool; a pool that grew (new pointers) or
    another pool gets a new capture; the graphs of the MAX_POOLS pools used last are kept;
    each replay points the slots at its graph's states."""
    sg = fa4_graph.SplitGraphs(512, 512 * 64, torch.device("cpu"))
    made = []

    def capture(pool, body, slots):
        made.append(pool.pointers)
        return pool.pointers, _Graph(), [("conv", len(made))]

    monkeypatch.setattr(sg, "_capture", capture)
    slots = types.SimpleNamespace(outputs=[None])
    pool, other = types.SimpleNamespace(pointers=[1, 2]), types.SimpleNamespace(pointers=[1, 2])
    for s in (0, 0, 2, 2, 0):
        sg.replay(s, pool, None, slots)
    assert len(made) == 2 and slots.outputs == [("conv", 1)]
    assert sorted(e[1].num_replays for e in sg.graphs.values()) == [2, 3]
    sg.replay(2, other, None, slots)                 # equal addresses, another list: captured
    assert len(made) == 3 and slots.outputs == [("conv", 3)]
    sg.replay(0, pool, None, slots)                  # both pools' graphs are kept
    sg.replay(2, other, None, slots)
    assert len(made) == 3 and slots.outputs == [("conv", 3)]
    old = pool.pointers
    pool.pointers = [5, 6]                            # KvPool.grow replaces the list
    sg.replay(0, pool, None, slots)
    assert len(made) == 4 and made[-1] is pool.pointers
    kept = {id(e[0]) for e in sg.graphs.values()}
    assert kept == {id(other.pointers), id(pool.pointers)} and id(old) not in kept
    assert len(sg.all()) == 2 == fa4_graph.MAX_POOLS


def _run_chunks(model, runner, kv, ids, t):
    from adapters import spec_for
    from block_store.layout import zero_gdn
    gdn = zero_gdn(spec_for(model.cfg, model.device, model.dtype))
    hidden = []
    for pos in range(0, len(ids), t):
        h, gdn = runner.run(ids[pos:pos + t], pos, kv, gdn)
        hidden.append(h)
    return hidden, gdn


def _kv_rows(kv, rows):
    """Every attention layer's K and V rows [0, rows) in row order."""
    out = []
    for k, v in kv.pool.layers():
        for x in (k, v):
            out.append(x[kv.pages].flatten(0, 1)[:rows])
    return out


@pytest.mark.skipif(not INTERPRET, reason="the tiny model on the CPU, Triton interpreted")
def test_the_graph_body_gives_the_segmented_bits(tiny, monkeypatch):
    """The body over the device-built tables (eager on the CPU, FA4 the fp32 fake) gives the
    segmented body's bits over chunks with and without splits, for pages anywhere."""
    from paged import paged_kv
    from test_attn_fa4 import _fake_package

    from adapters import spec_for
    monkeypatch.setattr(attn_fa4, "available", lambda device, dtype: True)
    _fake_package(monkeypatch)
    t, num_chunks = 64, 12
    ids = torch.randint(0, 248000, (num_chunks * t,),
                        generator=torch.Generator().manual_seed(4)).tolist()
    spec = spec_for(tiny.cfg, "cpu", torch.float32)
    runs = {}
    for in_graph, seed in ((True, 0), (False, 0), (True, 5)):
        runner = graphs.ChunkGraphs(tiny, t, attention="fa4", fused=False, page_rows=64,
                                    fa4_in_graph=in_graph)
        kv = paged_kv(spec, 64, num_chunks * t, seed=seed)
        runs[in_graph, seed] = (*_run_chunks(tiny, runner, kv, ids, t),
                                _kv_rows(kv, num_chunks * t), runner)
    splits = {runs[True, 0][3]._between.num_splits(p, t, torch.device("cpu"))
              for p in range(0, num_chunks * t, t)}
    assert 0 in splits and len(splits) >= 2
    assert sorted(runs[True, 0][3].split_graphs.tables) == sorted(splits)
    for other in ((False, 0), (True, 5)):
        assert all(torch.equal(a, b) for a, b in zip(runs[True, 0][0], runs[other][0]))
        assert all(torch.equal(a, b) for pair_a, pair_b in zip(runs[True, 0][1], runs[other][1])
                   for a, b in zip(pair_a, pair_b))
        assert all(torch.equal(a, b) for a, b in zip(runs[True, 0][2], runs[other][2]))


@pytest.mark.skipif(not HOPPER_FA4, reason="FA4's SM90 forward needs a Hopper GPU and "
                    "flash-attn-4")
def test_one_graph_chunks_equal_the_segmented_chunks_bit_for_bit():
    """random:qwen3.5-0.8b in bf16, 512-id chunks over shuffled 512-row pages from 0 to 6k
    (splits 0, 2, 3 and 4 on an H200): the one-graph runner's hidden states, GDN states and KV
    rows equal the segmented runner's bit for bit; over another pool it captures again and
    gives the same bits."""
    from paged import paged_kv

    from adapters import spec_for
    from adapters.model import load_model
    model = load_model("random:qwen3.5-0.8b", device="cuda")
    t, num_chunks = 512, 12
    ids = torch.randint(0, 248000, (num_chunks * t,),
                        generator=torch.Generator().manual_seed(4)).tolist()
    spec = spec_for(model.cfg, model.device, model.dtype)
    one = graphs.ChunkGraphs(model, t, page_rows=512)
    seg = graphs.ChunkGraphs(model, t, page_rows=512, fa4_in_graph=False, op_set=one.ops,
                             proj=one.proj)
    assert one.attention == seg.attention == "fa4" and one.split_graphs and not seg.split_graphs
    res = {}
    for name, runner, seed in (("one", one, 0), ("seg", seg, 0), ("moved", one, 9)):
        kv = paged_kv(spec, 512, num_chunks * t, seed=seed)
        res[name] = (*_run_chunks(model, runner, kv, ids, t), _kv_rows(kv, num_chunks * t))
    splits = {one._between.num_splits(p, t, model.device) for p in range(0, num_chunks * t, t)}
    assert len(splits) >= 3 and one.split_graphs.num_captures == 2 * len(splits)
    assert len(one.split_graphs.graphs) == 2 * len(splits)        # both pools' kept
    for other in ("seg", "moved"):
        assert all(torch.equal(a, b) for a, b in zip(res["one"][0], res[other][0])), other
        assert all(torch.equal(a, b) for pa, pb in zip(res["one"][1], res[other][1])
                   for a, b in zip(pa, pb)), other
        assert all(torch.equal(a, b) for a, b in zip(res["one"][2], res[other][2])), other
