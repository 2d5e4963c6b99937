"""One CUDA graph a chunk with FA4 inside, on a Hopper GPU (skipped without one): the same bits as the segmented chunks and question runners, no GDN states kept per graph."""
from __future__ import annotations

import pytest
import torch
from paged import kv_rows, run_chunks

from adapters.attention import fa4 as attn_fa4
from adapters.attention import fa4_plan
from adapters.runners import graphs

HOPPER_FA4 = torch.cuda.is_available() and attn_fa4.available(torch.device("cuda"),
                                                              torch.bfloat16)




def _gpu_runners(t: int, num_chunks: int, seed: int):
    """random:qwen3.5-0.8b on CUDA, its spec, num_chunks * t random ids, and two runners of t
    rows over 512-row pages sharing one compiled op set: FA4 in one graph, and segmented."""
    from adapters import spec_for
    from adapters.model import load_model
    model = load_model("random:qwen3.5-0.8b", device="cuda")
    ids = torch.randint(0, 248000, (num_chunks * t,),
                        generator=torch.Generator().manual_seed(seed)).tolist()
    spec = spec_for(model.cfg, model.device, model.dtype)
    one = graphs.ChunkGraphs(model, t, page_rows=512)
    seg = graphs.ChunkGraphs(model, t, page_rows=512, fa4_in_graph=False, op_set=one.ops,
                             proj=one.proj)
    return model, spec, ids, one, seg


@pytest.mark.skipif(not HOPPER_FA4, reason="FA4's SM90 forward needs a Hopper GPU and "
                    "flash-attn-4")
def test_one_graph_chunks_equal_the_segmented_chunks_bit_for_bit():
    """random:qwen3.5-0.8b in bf16, 512-id chunks over shuffled 512-row pages from 0 to 6k
    (splits 0, 2, 3 and 4 on an H200): the one-graph runner's hidden states, GDN states and KV
    rows equal the segmented runner's bit for bit; over another pool it captures again and
    gives the same bits."""
    from paged import paged_kv
    t, num_chunks = 512, 12
    model, spec, ids, one, seg = _gpu_runners(t, num_chunks, seed=4)
    assert one.attention == seg.attention == "fa4" and one.split_graphs and not seg.split_graphs
    kvs = {name: paged_kv(spec, 512, num_chunks * t, seed=seed)
           for name, seed in (("one", 0), ("seg", 0), ("moved", 9))}
    one.prepare(kvs["one"].pool)                  # as Reader.warm_up: every S over its pool
    all_splits = one._between.all_splits(t, model.device)
    assert one.split_graphs.num_captures == len(all_splits)
    res = {}
    for name, runner in (("one", one), ("seg", seg), ("moved", one)):
        kv = kvs[name]
        res[name] = (*run_chunks(model, runner, kv, ids, t), kv_rows(kv, num_chunks * t))
    splits = {one._between.num_splits(p, t, model.device) for p in range(0, num_chunks * t, t)}
    assert len(splits) >= 3 and set(splits) <= set(all_splits)
    # none captured while reading the first pool; the second pool's at its first chunks
    assert one.split_graphs.num_captures == len(all_splits) + len(splits)
    assert len(one.split_graphs.graphs) == len(all_splits) + len(splits)   # both pools kept
    for other in ("seg", "moved"):
        assert all(torch.equal(a, b) for a, b in zip(res["one"][0], res[other][0])), other
        assert all(torch.equal(a, b) for pa, pb in zip(res["one"][1], res[other][1])
                   for a, b in zip(pa, pb)), other
        assert all(torch.equal(a, b) for a, b in zip(res["one"][2], res[other][2])), other


@pytest.mark.skipif(not HOPPER_FA4, reason="FA4's SM90 forward needs a Hopper GPU and "
                    "flash-attn-4")
@pytest.mark.parametrize("t,num_chunks", [(64, 540), (128, 134), (256, 38)])
def test_one_graph_question_runner_equals_the_segmented_one_at_every_split(t, num_chunks):
    """Question runners of 64, 128 and 256 rows (the small buckets and the first 256-row one:
    up to 33, 16 and 8 splits on an H200), chunks from 0 to past S * 1,024 ids for the most
    splits S: every split count the warm-up captures, the same bits as the segmented
    runner's."""
    from paged import paged_kv
    model, spec, ids, one, seg = _gpu_runners(t, num_chunks, seed=5)
    kvs = [paged_kv(spec, 512, num_chunks * t, seed=1) for _ in range(2)]
    one.prepare(kvs[0].pool)
    res = [run_chunks(model, r, kv, ids, t) + (kv_rows(kv, num_chunks * t),)
           for r, kv in ((one, kvs[0]), (seg, kvs[1]))]
    all_splits = one._between.all_splits(t, model.device)
    seen = {one._between.num_splits(p, t, model.device) for p in range(0, num_chunks * t, t)}
    assert seen == set(all_splits) and len(seen) > 5
    assert one.split_graphs.num_captures == len(all_splits)      # all at the warm-up
    for a, b in zip(res[0], res[1]):
        flat_a = [x for y in a for x in (y if isinstance(y, tuple) else (y,))]
        flat_b = [x for y in b for x in (y if isinstance(y, tuple) else (y,))]
        assert all(torch.equal(x, y) for x, y in zip(flat_a, flat_b))


@pytest.mark.skipif(not HOPPER_FA4, reason="FA4's SM90 forward needs a Hopper GPU and "
                    "flash-attn-4")
def test_a_question_runner_holds_no_states_per_graph_and_gives_the_same_hidden_rows():
    """A 64-row question runner (return_states=False, up to 33 FA4 splits on an H200) against
    the same runner returning states: at a chunk of every split count (random KV rows below
    and random states, the same in both), in order and then in reverse, the same hidden rows
    and KV rows bit for bit; capturing all its splits over a pool
    (after the warm-up, which compiles) holds less memory than the other's by at least 3/4
    of one set of output states a graph after the first (a set: 18 recurrent states of
    1 MiB and the conv states on the 0.8B; measured 2026-12-02 on an H200 with the warm-up
    inside: 663 MB held by the 33 graphs returning states,
    docs/gpu-tests-states-2026-12-02.log)."""
    from paged import paged_kv

    from adapters import spec_for
    from block_store.memory.layout import zero_gdn
    model, spec, ids, one, _ = _gpu_runners(64, 1, seed=6)
    question = graphs.ChunkGraphs(model, 64, page_rows=512, op_set=one.ops, proj=one.proj,
                                  return_states=False)
    splits = one._between.all_splits(64, model.device)
    rows = (max(splits) + 1) * fa4_plan.MIN_SPLIT_KEYS
    kvs = [paged_kv(spec, 512, rows, seed=1) for _ in range(2)]
    held = []
    for runner, kv in ((question, kvs[1]), (one, kvs[0])):
        runner.prepare()                  # the warm-up (compiles, kept buffers): no pool yet
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        runner.prepare(kv.pool)           # the captures of every split over the pool
        torch.cuda.synchronize()
        held.append(torch.cuda.memory_allocated() - before)
    set_bytes = sum(x.numel() * x.element_size() for pair in one.slots.inputs for x in pair)
    assert held[1] - held[0] >= (len(splits) - 1) * set_bytes * 3 // 4, (held, set_bytes)
    gen = torch.Generator(device=model.device).manual_seed(8)
    gdn = [tuple(torch.randn(x.shape, generator=gen, device=x.device).to(x.dtype) * 0.1
                 for x in pair) for pair in zero_gdn(spec_for(model.cfg, model.device,
                                                               model.dtype))]
    first = {}
    # every split in order, then again in reverse after all captures: a graph whose freed
    # output blocks a later capture took must still give the same rows
    for s in splits + splits[::-1]:
        pos = s * fa4_plan.MIN_SPLIT_KEYS
        assert one._between.num_splits(pos, 64, model.device) == s
        a, b = (r.run(ids, pos, kv, gdn) for r, kv in ((one, kvs[0]), (question, kvs[1])))
        assert b[1] is None and len(a[1]) == len(gdn) and torch.equal(a[0], b[0])
        assert torch.equal(first.setdefault(s, b[0]), b[0])
    assert question.split_graphs.num_captures == len(splits) == len(first) > 5
    assert all(torch.equal(x, y) for x, y in zip(kv_rows(kvs[0], rows), kv_rows(kvs[1], rows)))
