"""The table-addressed attention kernel (Triton, run by Triton's interpreter on the CPU) against
its pure-torch twin ref.attend_ref, and its KV write, on real-shaped heads.

Skipped where triton is not installed. The interpreter's tl.dot multiplies bfloat16 operands as
their raw 16-bit patterns (numpy has no bfloat16), so these tests run in float16, and only
there (they build CPU tensors); on a GPU the kernel runs in bfloat16 under `shadow-reader
bench --attention table`, whose exact part checks the committed state."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")

from adapters.attention import table as at  # noqa: E402
from adapters.model.ref import attend_ref  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="CPU tensors for Triton's interpreter")
DT = torch.float16
SMALL = at.SplitConfig(block_m=16, block_n=16, s_max=4, min_split=32, num_warps=4)


def _case(t, pos, h=4, hkv=2, d=32, cap_extra=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    cap = pos + t + cap_extra
    k_buf = torch.randn(cap, hkv, d, generator=g).to(DT)
    v_buf = torch.randn(cap, hkv, d, generator=g).to(DT)
    q = torch.randn(t, h, d, generator=g).to(DT)
    return q, k_buf, v_buf


PAGE = 16       # rows a page in these tests (the reader's pages hold G rows)


def _paged(k_buf, v_buf, seed=0, spare=2, page=PAGE):
    """Pools of `page`-row pages holding the rows of k_buf, v_buf (padded to whole pages) in a
    shuffled order among spare pages of noise; returns (k_pool, v_pool, page table int64)."""
    g = torch.Generator().manual_seed(seed)
    n = -(-k_buf.shape[0] // page)
    pages = torch.randperm(n + spare, generator=g)[:n]
    pad = n * page - k_buf.shape[0]
    pools = []
    for buf in (k_buf, v_buf):
        pool = torch.randn(n + spare, page, *buf.shape[1:], generator=g).to(DT)
        pool[pages] = torch.nn.functional.pad(buf, (0, 0, 0, 0, 0, pad)).view(n, page,
                                                                            *buf.shape[1:])
        pools.append(pool)
    return pools[0], pools[1], pages


def _ptrs(k_pool, v_pool):
    """(base, places): the pools as the kernels take them, offsets from a tensor of theirs."""
    base = torch.empty(8, dtype=k_pool.dtype)
    return base, torch.tensor(at.pool_places(base, (k_pool, v_pool)), dtype=torch.int64)


def _run(q, k_buf, v_buf, pos, cfg, seed=0, page=PAGE):
    t, h, d = q.shape
    k_pool, v_pool, pages = _paged(k_buf, v_buf, seed, page=page)
    o_part, l_part = at.scratch(t, h, d, cfg, q.device)
    out = torch.empty(t, h * d, dtype=q.dtype)
    return at.attend_table(q, *_ptrs(k_pool, v_pool), torch.tensor([pos]), k_buf.shape[1],
                           o_part, l_part, out, cfg, pages, page)


@pytest.mark.parametrize("t,pos", [(1, 0), (5, 0), (16, 0), (16, 40), (1, 150), (23, 137)])
def test_attend_table_matches_twin(t, pos):
    q, k_buf, v_buf = _case(t, pos)
    got = _run(q, k_buf, v_buf, pos, SMALL)
    want = attend_ref(q, k_buf, v_buf, pos)
    err = (got.float() - want.float()).abs().max().item()
    assert err < 4e-3, err                       # P.V in half precision, as FlashAttention
    assert torch.isfinite(got.float()).all()


def test_attend_table_ignores_where_pages_lie_and_rows_past_the_end():
    """Bits depend on (pos, T, values) only: other page orders and spare pages, garbage past
    pos + T."""
    q, k_buf, v_buf = _case(9, 70, cap_extra=3)
    a = _run(q, k_buf, v_buf, 70, SMALL)
    big_k = torch.cat([k_buf, torch.randn(50, *k_buf.shape[1:]).to(k_buf.dtype)])
    big_v = torch.cat([v_buf, torch.randn(50, *v_buf.shape[1:]).to(v_buf.dtype)])
    big_k[79:], big_v[79:] = 1e4, -1e4
    b = _run(q, big_k, big_v, 70, SMALL, seed=5)
    assert torch.equal(a, b)


def test_attend_table_refuses_a_key_block_that_does_not_divide_the_page():
    q, k_buf, v_buf = _case(4, 16)
    with pytest.raises(ValueError, match="need a key block dividing them"):
        _run(q, k_buf, v_buf, 16, at.SplitConfig(block_m=16, block_n=32, s_max=2,
                                                  min_split=32, num_warps=4))


def test_splits_agree_with_one_split():
    q, k_buf, v_buf = _case(16, 200)
    one = at.SplitConfig(block_m=16, block_n=16, s_max=1, min_split=16, num_warps=4)
    a = _run(q, k_buf, v_buf, 200, SMALL).float()
    b = _run(q, k_buf, v_buf, 200, one).float()
    assert (a - b).abs().max().item() < 4e-3


# page splits: the keys cut at page boundaries (pages of 32 rows, two 16-key blocks each),
# against the block walk with the same splits (min_split 64 rounds both alike up to 256 keys)
BLOCKS = at.SplitConfig(block_m=16, block_n=16, s_max=4, min_split=64, num_warps=4)
PAGED = at.SplitConfig(block_m=16, block_n=16, s_max=4, min_split=64, num_warps=4,
                       page_splits=True)


@pytest.mark.parametrize("t,pos", [(1, 0), (1, 31), (1, 150), (5, 27), (16, 40), (23, 137),
                                   (1, 255)])
def test_page_splits_give_the_block_walks_bits_and_match_the_twin(t, pos):
    q, k_buf, v_buf = _case(t, pos)
    got = _run(q, k_buf, v_buf, pos, PAGED, page=32)
    assert torch.equal(got, _run(q, k_buf, v_buf, pos, BLOCKS, page=32))
    err = (got.float() - attend_ref(q, k_buf, v_buf, pos).float()).abs().max().item()
    assert err < 4e-3, err


def test_page_splits_past_min_split_ignore_where_pages_lie_and_match_the_twin():
    """1,000 keys in 4 splits of 256 (8 pages each): the pages' order changes no bit."""
    q, k_buf, v_buf = _case(1, 999)
    cfg = at.SplitConfig(block_m=16, block_n=16, s_max=4, min_split=32, num_warps=4,
                         page_splits=True)
    a = _run(q, k_buf, v_buf, 999, cfg, page=32)
    assert torch.equal(a, _run(q, k_buf, v_buf, 999, cfg, seed=7, page=32))
    blocks = at.SplitConfig(block_m=16, block_n=16, s_max=4, min_split=32, num_warps=4)
    assert torch.equal(a, _run(q, k_buf, v_buf, 999, blocks, page=32))    # splits of 256 too
    err = (a.float() - attend_ref(q, k_buf, v_buf, 999).float()).abs().max().item()
    assert err < 4e-3, err


# the decode combine: every split at once, against the combine in split order (other sums,
# so not the same bits) and the twin
VECTOR = at.SplitConfig(block_m=16, block_n=16, s_max=4, min_split=16, num_warps=4,
                        vector_combine=True)
IN_ORDER = at.SplitConfig(block_m=16, block_n=16, s_max=4, min_split=16, num_warps=4)


@pytest.mark.parametrize("t,pos", [(1, 0), (1, 15), (1, 40), (1, 150), (3, 27), (1, 999)])
def test_vector_combine_matches_the_combine_in_order_and_the_twin(t, pos):
    q, k_buf, v_buf = _case(t, pos, d=128)
    got = _run(q, k_buf, v_buf, pos, VECTOR)
    near = (got.float() - _run(q, k_buf, v_buf, pos, IN_ORDER).float()).abs().max().item()
    assert near < 2e-2, near                   # one bf16 rounding of the output apart at most
    err = (got.float() - attend_ref(q, k_buf, v_buf, pos).float()).abs().max().item()
    assert err < 4e-3, err
    assert torch.equal(got, _run(q, k_buf, v_buf, pos, VECTOR, seed=7))   # pages elsewhere


@pytest.mark.parametrize("t,pos", [(1, 0), (1, 40), (1, 150), (5, 27), (16, 40), (23, 137)])
def test_page_entries_loaded_a_block_ahead_give_the_same_bits(t, pos):
    """SplitConfig.ahead changes when a block's page entry is loaded, not what is summed: the
    same bits as the walk without it, at splits that cross pages and at the last page, for
    chunk and decode tilings, wherever the pages lie."""
    q, k_buf, v_buf = _case(t, pos)
    for cfg in (SMALL, VECTOR):
        ahead = dataclasses.replace(cfg, ahead=True)
        want = _run(q, k_buf, v_buf, pos, cfg)
        assert torch.equal(_run(q, k_buf, v_buf, pos, ahead), want)
        assert torch.equal(_run(q, k_buf, v_buf, pos, ahead, seed=5), want)


def test_split_config_refuses_ahead_with_page_splits():
    with pytest.raises(ValueError, match="ahead not with page_splits"):
        at.SplitConfig(min_split=512, page_splits=True, ahead=True)


def test_split_config_refuses_a_vector_combine_it_cannot_take():
    with pytest.raises(ValueError, match="vector_combine"):
        at.SplitConfig(s_max=3, vector_combine=True)


def test_page_splits_refuse_a_min_split_that_is_not_whole_pages():
    q, k_buf, v_buf = _case(1, 40)
    with pytest.raises(ValueError, match="min_split a multiple"):
        _run(q, k_buf, v_buf, 40, at.SplitConfig(block_m=16, block_n=16, s_max=4,
                                                 min_split=48, num_warps=4, page_splits=True),
             page=32)


def _rows(pool, pages):
    """The sequence's rows [len(pages) * PAGE, ...] in page order."""
    return pool[pages].flatten(0, 1)


def test_write_kv_writes_only_its_rows():
    """Rows 13..18 span two pages (12..15 | 16..); only they change, in the pages named."""
    g = torch.Generator().manual_seed(1)
    k_pool, v_pool, pages = _paged(torch.randn(40, 2, 32, generator=g).to(DT),
                                   torch.randn(40, 2, 32, generator=g).to(DT))
    k0, v0 = k_pool.clone(), v_pool.clone()
    k = torch.randn(6, 2, 32, generator=g).to(DT)
    v = torch.randn(6, 2, 32, generator=g).to(DT)
    at.write_kv(k, v, *_ptrs(k_pool, v_pool), torch.tensor([13]), pages, PAGE)
    for pool, before, new in ((k_pool, k0, k), (v_pool, v0, v)):
        got, was = _rows(pool, pages), _rows(before, pages)
        assert torch.equal(got[13:19], new)
        assert torch.equal(got[:13], was[:13]) and torch.equal(got[19:], was[19:])
        spare = [i for i in range(pool.shape[0]) if i not in pages.tolist()]
        assert torch.equal(pool[spare], before[spare])


def test_write_kv_takes_rows_strided_as_a_fused_projection_leaves_them():
    """v as a column slice of a wider projection (rows far apart, each contiguous within) is
    written as it lies; rows not contiguous within are refused with a ValueError."""
    g = torch.Generator().manual_seed(2)
    k_pool, v_pool = torch.zeros(2, PAGE, 2, 32).to(DT), torch.zeros(2, PAGE, 2, 32).to(DT)
    pages = torch.tensor([1, 0])
    wide = torch.randn(5, 3 * 64, generator=g).to(DT)
    k, v = wide[:, :64].view(5, 2, 32), wide[:, 128:].view(5, 2, 32)
    table = _ptrs(k_pool, v_pool)
    at.write_kv(k, v, *table, torch.tensor([3]), pages, PAGE)
    assert torch.equal(k_pool[1, 3:8], k) and torch.equal(v_pool[1, 3:8], v)
    assert not k_pool[0].any() and not v_pool[1, 8:].any()
    with pytest.raises(ValueError, match="rows contiguous within"):
        at.write_kv(k.transpose(1, 2), v, *table, torch.tensor([3]), pages, PAGE)


def test_chunk_runner_with_table_attention_matches_the_forward(tiny):
    """The whole-chunk body with the table attention (as captured on CUDA) against
    Qwen35.forward (SDPA) over three chunks: hidden, KV rows, GDN states, in fp32."""
    from paged import paged_kv

    from adapters import spec_for
    from adapters.runners.graphs import ChunkGraphs
    from block_store.memory.layout import zero_gdn
    cfg, t = tiny.cfg, 64
    ids = torch.randint(0, 248000, (3 * t,), generator=torch.Generator().manual_seed(5))
    runs = []
    for seed, fn in enumerate((tiny, ChunkGraphs(tiny, t, attention="table").run)):
        spec = spec_for(cfg, "cpu", torch.float32)
        kv, gdn = paged_kv(spec, t, 3 * t + 5, seed), zero_gdn(spec)
        for pos in range(0, 3 * t, t):
            h, gdn = fn(ids[pos:pos + t], pos, kv, gdn)
        runs.append((h, kv.gather(3 * t), gdn))
    (h1, kv1, g1), (h2, kv2, g2) = runs
    close = lambda a, b: (a.float() - b.float()).abs().max().item() < 1e-4  # noqa: E731
    assert close(h1, h2)
    assert all(close(a[:3 * t], b[:3 * t]) for p, q in zip(kv1, kv2) for a, b in zip(p, q))
    assert all(close(a, b) for p, q in zip(g1, g2) for a, b in zip(p, q))


def test_chunk_runner_refuses_pages_too_few_or_of_another_size(tiny):
    from paged import paged_kv

    from adapters import spec_for
    from adapters.runners.graphs import ChunkGraphs
    from block_store.memory.layout import zero_gdn
    runner = ChunkGraphs(tiny, 64, attention="table")
    kv = paged_kv(spec_for(tiny.cfg, "cpu", torch.float32), 64, 100)
    with pytest.raises(ValueError, match="cannot take rows up to 192"):
        runner.run(torch.zeros(64, dtype=torch.long), 128, kv,
                   zero_gdn(spec_for(tiny.cfg, "cpu", torch.float32)))
    with pytest.raises(ValueError, match="pages of 128 rows cannot take"):
        runner.run(torch.zeros(64, dtype=torch.long), 0,
                   paged_kv(spec_for(tiny.cfg, "cpu", torch.float32), 128, 128),
                   zero_gdn(spec_for(tiny.cfg, "cpu", torch.float32)))


@pytest.fixture(scope="module")
def tiny_deep():
    """tiny with its full-attention layer first (full, GDN, GDN, full), so the attention's bits
    reach the committed state (in tiny they reach only the last layer's output)."""
    import dataclasses

    from adapters.model.config import FULL, LINEAR, PRESETS
    from adapters.model.qwen35 import ModelInfo
    from adapters.model.weights import build_model, random_tensors
    cfg = dataclasses.replace(PRESETS["tiny"], layer_types=(FULL, LINEAR, LINEAR, FULL))
    return build_model(cfg, random_tensors(cfg), ModelInfo("tiny-deep", "", True))


def test_reader_on_table_attention_stays_exact(tiny_deep):
    """Every whole chunk a reader commits (reads, asks at or above C, forks below C) goes
    through its chunk runner: with the table attention (other bits than the eager forward)
    the state still equals a fresh prefill through the same runner; an ask (through a padded
    question runner) below C equals a fresh reader's, and so does a decode through the
    single-token runner."""
    from adapters import GraphAdapter
    from adapters.runners.runners import Runners
    from shadow_plugin.chat.router import ROUTER
    from shadow_plugin.reader.reader import Reader
    tiny = tiny_deep

    class SmallRunners(Runners):
        BUCKET = 64                      # keeps the interpreter's work small

    def reader():
        runners = SmallRunners(tiny, 64, attention="table")
        return Reader(GraphAdapter(tiny, 64, runners=runners), max_checkpoints=2)

    ids = torch.randint(0, 248000, (300,), generator=torch.Generator().manual_seed(9)).tolist()
    r = reader()
    r.feed("s", ids[:200], "prompt")
    r.read("s", max_chunks=2)
    a = r.ask("s", ROUTER.question, list(ROUTER.choices), at=200)    # commits up to 192
    assert r.committed("s") == 192 and r.check_exact("s")
    r.feed("s", ids[200:], "output")
    r.read("s")
    below = r.ask("s", ROUTER.question, list(ROUTER.choices), at=200)
    assert r.check_exact("s")
    fresh = reader()
    fresh.feed("f", ids[:200], "prompt")
    want = fresh.ask("f", ROUTER.question, list(ROUTER.choices), at=200)
    assert below.probs == want.probs == a.probs
    gen = r.generate("s", [11, 12, 13], max_new_tokens=4, at=250, stop_ids=())
    assert fresh.generate("f", [11, 12, 13], max_new_tokens=4, at=200, stop_ids=()).ids == \
        r.generate("s", [11, 12, 13], max_new_tokens=4, at=200, stop_ids=()).ids
    assert len(gen.ids) == 4 and r.check_exact("s")


def test_fused_ops_runner_is_close_to_the_eager_runner(tiny_deep):
    """The runner with its small ops through torch.compile (as on CUDA) against ops.EAGER:
    hidden and GDN states close in fp32 after two chunks; deterministic on a second run."""
    from paged import paged_kv

    from adapters import spec_for
    from adapters.runners.graphs import ChunkGraphs
    from block_store.memory.layout import zero_gdn
    cfg, t = tiny_deep.cfg, 64
    ids = torch.randint(0, 248000, (2 * t,), generator=torch.Generator().manual_seed(3))
    runs = []
    for fused in (False, True, True):
        runner = ChunkGraphs(tiny_deep, t, attention="table", fused=fused)
        spec = spec_for(cfg, "cpu", torch.float32)
        kv, gdn = paged_kv(spec, t, 2 * t), zero_gdn(spec)
        for pos in (0, t):
            h, gdn = runner.run(ids[pos:pos + t], pos, kv, gdn)
        runs.append((h, gdn))
    (h0, g0), (h1, g1), (h2, g2) = runs
    assert (h0 - h1).abs().max().item() < 1e-4
    assert all((a - b).abs().max().item() < 1e-4 for p, q in zip(g0, g1) for a, b in zip(p, q))
    assert torch.equal(h1, h2)


def test_runners_prepare_sizes_and_decode(tiny):
    """Runners without small buckets: question lengths go to multiples of BUCKET (none past
    MAX_ROWS); prepare builds the decode and bucket runners (nothing to capture on the
    CPU)."""
    from adapters.runners.runners import Runners
    r = Runners(tiny, 64, small_bucket_rows=())
    assert r.for_rows(1).t == r.BUCKET and r.for_rows(r.BUCKET + 1).t == 2 * r.BUCKET
    assert r.for_rows(r.MAX_ROWS + 1) is None
    r.prepare()
    assert r.decode().t == 1 and sorted(r._sized) == [1] + [r.BUCKET * k for k in range(1, 5)]
    assert all(x.graph is None for x in r._sized.values())       # no graphs on the CPU
    assert all(x.ops is r.chunk.ops for x in r._sized.values())  # one (compiled) op set


def test_question_runners_give_back_no_states_and_the_same_hidden_rows(tiny):
    """A question runner (Runners.for_rows) returns (hidden, None): its states are not copied
    out (ChunkGraphs' return_states); its hidden rows equal those of a runner that returns
    states; the chunk and decode runners still return them; take() on its slots is refused."""
    from adapters import spec_for
    from adapters.runners.graphs import ChunkGraphs
    from adapters.runners.runners import Runners
    from block_store import contiguous_kv
    from block_store.memory.layout import zero_gdn
    r = Runners(tiny, 128, small_bucket_rows=(64,))
    question = r.for_rows(40)
    assert question.t == 64 and not question.slots.returned
    assert r.chunk.slots.returned and r.decode().slots.returned
    twin = ChunkGraphs(tiny, 64, op_set=r.chunk.ops, proj=r.chunk.proj,   # returns states
                       page_rows=128)
    spec = spec_for(tiny.cfg, tiny.device, tiny.dtype)
    ids = torch.randint(0, 248000, (64,), generator=torch.Generator().manual_seed(7)).tolist()
    outs = []
    for runner in (question, twin):
        kv = contiguous_kv(spec, 128, 256)
        kv.pool.block.zero_()
        outs.append(runner.run(ids, 128, kv, zero_gdn(spec)))
    assert outs[0][1] is None and len(outs[1][1]) == len(tiny.cfg.linear_layers)
    assert torch.equal(outs[0][0], outs[1][0])
    with pytest.raises(RuntimeError, match="return no states"):
        question.slots.take()
    question.slots.release()
    assert question.slots.outputs == [None] * len(tiny.cfg.linear_layers)
    twin_outputs = list(twin.slots.outputs)
    twin.slots.release()                        # slots that return states keep them
    assert all(a is b for a, b in zip(twin.slots.outputs, twin_outputs))


def test_runners_small_bucket_rows_pad_short_questions_to_fewer_rows(tiny):
    """small_bucket_rows: a forward pads to the first small bucket that holds it, else to a
    multiple of BUCKET; prepare builds their runners too; bad buckets are refused by name."""
    from adapters.runners.runners import Runners
    assert Runners(tiny, 512).small_bucket_rows == (64, 128)       # the default
    assert Runners(tiny, 512, small_bucket_rows=()).rows_of(1) == 256
    r = Runners(tiny, 512, small_bucket_rows=(64, 128))
    rows = [r.rows_of(n) for n in (1, 64, 65, 69, 128, 129, 256, 257, 769)]
    assert rows == [64, 64, 128, 128, 128, 256, 256, 512, 1024]
    assert r.for_rows(69).t == 128 and r.for_rows(300) is r.chunk
    r.prepare()
    assert sorted(r._sized) == [1, 64, 128, 256, 768, 1024]   # 512: the chunk runner
    for bad, why in (((100,), "multiple of 64"), ((0,), "positive"), ((256,), "below 256"),
                     ((True,), "multiple of 64"), ((128, 64), "go up"), ((64, 64), "each once"),
                     (64, "a sequence"), ("64,128", "a sequence"), ((64.0,), "got 64.0")):
        with pytest.raises(ValueError, match=why):
            Runners(tiny, 512, small_bucket_rows=bad)
    import numpy as np
    r = Runners(                                  # numpy's integers are row counts too
        tiny, 512, small_bucket_rows=np.array([64, 128]))
    assert r.small_bucket_rows == (64, 128) and type(r.small_bucket_rows[0]) is int


def test_a_short_question_through_a_small_bucket_at_and_below_c(tiny):
    """A 37-id question padded to 64 rows (not 256): asked at C, below C after reading on, and
    on a fresh reader, the same probabilities bit for bit; close to the 256-row runner's."""
    from adapters import GraphAdapter
    from adapters.runners.runners import Runners
    from shadow_plugin.reader.reader import Reader

    def reader(small_bucket_rows):
        runners = Runners(tiny, 128, small_bucket_rows=small_bucket_rows)
        return Reader(GraphAdapter(tiny, 128, runners=runners))

    ids = torch.randint(0, 248000, (500,), generator=torch.Generator().manual_seed(4)).tolist()
    question, choices = "Is this about code?", ["yes", "no"]
    r = reader((64,))
    r.feed("s", ids[:256], "prompt")
    at_c = r.ask("s", question, choices, at=256)
    assert r.committed("s") == 256 and sorted(r.adapter.runners._sized) == [64]
    r.feed("s", ids[256:], "output")
    r.read("s")
    below = r.ask("s", question, choices, at=256)
    assert r.committed("s") == 384 and r.check_exact("s")
    fresh = reader((64,))
    fresh.feed("f", ids[:256], "prompt")
    assert fresh.ask("f", question, choices, at=256).probs == below.probs == at_c.probs
    wide = reader(())
    wide.feed("w", ids[:256], "prompt")
    probs = wide.ask("w", question, choices, at=256).probs
    assert sorted(wide.adapter.runners._sized) == [256]
    assert max(abs(a - b) for a, b in zip(probs, at_c.probs)) < 1e-5


def test_pool_places_refuses_another_dtype_or_a_pool_off_16_bytes():
    """Offsets are multiples of 16 bytes (the kernels' loads assume it) in the base's dtype;
    rows of another dtype than the base are refused before a kernel runs."""
    base = torch.empty(8, dtype=DT)
    pool = torch.zeros(2, PAGE, 2, 32, dtype=DT)
    assert at.pool_places(base, (pool,)) == [(pool.data_ptr() - base.data_ptr()) // 2]
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        at.pool_places(base, (pool.view(-1)[1:],))
    with pytest.raises(ValueError, match="same dtype"):
        at.pool_places(base, (pool.float(),))
    k = torch.zeros(1, 2, 32, dtype=torch.float32)
    with pytest.raises(ValueError, match="rows of torch.float32 with pools of torch.float16"):
        at.write_kv(k, k, base, torch.zeros(2, dtype=torch.int64), torch.tensor([0]),
                    torch.tensor([0]), PAGE)
    with pytest.raises(ValueError, match="rows of torch.float32 with pools of torch.float16"):
        at.write_kv(k.half(), k, base, torch.zeros(2, dtype=torch.int64), torch.tensor([0]),
                    torch.tensor([0]), PAGE)
