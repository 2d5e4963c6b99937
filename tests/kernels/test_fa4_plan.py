"""FA4's page tables as a runner stages them (fa4_plan.plan_into, written behind the page table
in the runner's staging buffer by runners.meta.ChunkMeta.stage_plan, which the runner calls after
launching its first graph) against their slow twin:
every sub-page of the sequence's pages in row order (attn_fa4.all_sub_pages), the splits'
[0, S Ls) as S rows, the tail [S Ls, pos + T) as one; both 16-byte aligned; the page table
left as it was. On the CPU, with FA4 declared available (no kernel runs)."""
import os
import random
import types

import pytest
import torch

from adapters.attention import fa4 as attn_fa4
from adapters.attention import fa4_plan
from adapters.runners import graphs


def _twin(pos, t, pages, page_rows):
    s, ls = fa4_plan.split_plan(pos, t, 8, 2, 132)
    sub = torch.from_numpy(attn_fa4.all_sub_pages(pages, page_rows))
    cut, n = s * ls // fa4_plan.SUB_PAGE, (pos + t) // fa4_plan.SUB_PAGE
    return (s, ls), (sub[:cut].view(s, -1) if s else None), sub[cut:n].view(1, -1)


@pytest.mark.parametrize("page_rows,t", [(64, 64), (128, 512), (192, 128), (512, 512)])
def test_staged_tables_equal_the_twin_and_leave_the_page_table(tiny, monkeypatch, page_rows, t):
    monkeypatch.setattr(attn_fa4, "available", lambda device, dtype: True)
    monkeypatch.setattr(attn_fa4, "_num_sms", lambda index: 132)
    runner = graphs.ChunkGraphs(tiny, t, attention="fa4", fused=False, page_rows=page_rows,
                                fa4_in_graph=False)
    runner._between._heads = (8, 2)              # the 0.8B's heads: splits happen at these t
    rng = random.Random(page_rows + t)
    base = runner.staged.pool_base                 # layer i's pools 16 * i bytes past it
    num = runner.staged.table_at - t - 1
    pool = types.SimpleNamespace(pointers=[base.data_ptr() + 16 * i for i in range(num)],
                                 block=base)
    step = 16 // base.element_size()
    sizes = [rng.randrange(1, 60) for _ in range(25)] + [graphs.MAX_TABLE_PAGES] * 2
    num_split = 0
    for n in sizes:
        if n * page_rows < t:
            continue
        pages = rng.sample(range(5 * n), n)
        pos = 64 * rng.randrange(0, (n * page_rows - t) // 64 + 1)
        runner.meta.fill_(-1)
        runner._stage([0] * t, pos, types.SimpleNamespace(pages=pages, pool=pool))
        assert runner._plan is None                # staged at the first attention
        assert runner.staged.table(n).tolist() == pages
        plan = runner.staged.stage_plan()
        splits, split, tail = _twin(pos, t, pages, page_rows)
        assert plan.splits == splits and torch.equal(plan.tail.long(), tail)
        assert (plan.split is None) == (split is None)
        assert plan.split is None or torch.equal(plan.split.long(), split)
        num_split += plan.split is not None
        assert plan.tail.data_ptr() % 16 == 0
        assert plan.split is None or plan.split.data_ptr() % 16 == 0
        assert runner.staged.table(n).tolist() == pages
        assert [runner.staged.places(j).tolist() for j in range(num // 2)] == \
            [[2 * j * step, (2 * j + 1) * step] for j in range(num // 2)]
    assert num_split > 5                          # the splits' tables were checked too


def test_the_plan_and_the_staged_plan_agree(monkeypatch):
    """FA4Attention.plan (a tensor of its own) gives the staged tables' contents."""
    monkeypatch.setattr(attn_fa4, "_num_sms", lambda index: 132)
    attn = attn_fa4.FA4Attention(8, 2)
    pages = list(range(40))[::-1]
    for pos, t in ((0, 512), (16384, 512), (19968, 64), (4096, 256)):
        plan = attn.plan(pos, t, pages, 512, torch.device("cpu"))
        splits, split, tail = _twin(pos, t, pages, 512)
        assert plan.splits == splits and torch.equal(plan.tail.long(), tail)
        assert plan.split is None or torch.equal(plan.split.long(), split)
    with pytest.raises(ValueError, match="sub-pages of 64"):
        attn.plan(64, 37, pages, 512, torch.device("cpu"))


def test_a_position_off_the_sub_pages_is_refused_before_anything_is_staged(tiny, monkeypatch):
    monkeypatch.setattr(attn_fa4, "available", lambda device, dtype: True)
    runner = graphs.ChunkGraphs(tiny, 64, attention="fa4", fused=False, page_rows=128)
    base = runner.staged.pool_base
    num = runner.staged.table_at - 64 - 1
    pool = types.SimpleNamespace(pointers=[base.data_ptr() + 16 * i for i in range(num)],
                                 block=base)
    runner.meta.fill_(-1)
    with pytest.raises(ValueError, match="sub-pages of 64"):
        runner._stage([0] * 64, 32, types.SimpleNamespace(pages=[3, 1], pool=pool))
    assert (runner.meta == -1).all() and (runner.staged.host == 0).all()


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the tiny model on the CPU, Triton interpreted")
def test_the_runner_stages_its_plan_once_a_chunk_and_keeps_its_bits(tiny, monkeypatch):
    """A FA4 runner through its eager body (FA4 replaced by the fp32 fake of test_attn_fa4):
    the plan staged once a chunk, at the first attention; the same bits with the pages
    elsewhere; near SDPA's attention."""
    from fake_fa4 import fake_package
    from paged import paged_kv

    from adapters import spec_for
    from block_store.memory.layout import zero_gdn
    monkeypatch.setattr(attn_fa4, "available", lambda device, dtype: True)
    monkeypatch.setattr(attn_fa4, "_num_sms", lambda index: 132)
    fake_package(monkeypatch)
    t, num_chunks = 64, 12
    ids = torch.randint(0, 248000, (num_chunks * t,), generator=torch.Generator().manual_seed(3))

    def run(attention, seed):
        runner = graphs.ChunkGraphs(tiny, t, attention=attention, fused=False, page_rows=64,
                                    fa4_in_graph=False)
        calls = []
        if attention == "fa4":
            stage_plan = runner.staged.stage_plan
            monkeypatch.setattr(runner.staged, "stage_plan",
                                lambda: (calls.append(runner._plan), stage_plan())[1])
        spec = spec_for(tiny.cfg, "cpu", torch.float32)
        kv, gdn = paged_kv(spec, 64, num_chunks * t, seed=seed), zero_gdn(spec)
        for pos in range(0, num_chunks * t, t):
            hidden, gdn = runner.run(ids[pos:pos + t].tolist(), pos, kv, gdn)
        return hidden, calls

    hidden, calls = run("fa4", 0)
    assert calls == [None] * num_chunks                 # once a chunk, none staged before
    assert attn_fa4.split_plan(num_chunks * t - t, t, *tiny_heads(tiny), 132)[0] > 0
    assert torch.equal(hidden, run("fa4", 5)[0])       # pages elsewhere: the same bits
    assert (hidden - run("sdpa", 0)[0]).abs().max().item() < 1e-3


def tiny_heads(model) -> tuple[int, int]:
    return model.cfg.num_attention_heads, model.cfg.num_key_value_heads
