"""attention.fa4 (FlashAttention-4's Hopper forward, flash-attn-4, over KV pages) against its
pure-torch twin ref.attend_ref over the gathered rows, with the package faked over that twin
(fake_fa4) so the plans, splits and combines run on any machine; where it cannot run, asking
for it is refused with the reason. On a Hopper GPU, tests/gpu/test_attn_fa4_hopper.py runs the
real kernels against the twin and FlashAttention-2; the same checks, with timings, ran on the
H200 in evals/fa4_probe.py at cadb457."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():               # the combine kernel through Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fake_fa4 import fake_package  # noqa: E402
from paged import FA4_PAGE, fa4_pools  # noqa: E402

from adapters.attention import combine as attn_combine  # noqa: E402
from adapters.attention import fa4 as attn_fa4
from adapters.model.ref import attend_ref  # noqa: E402
from adapters.runners.graphs import ATTENTIONS, default_attention  # noqa: E402
from shadow_plugin.reader.reader import Reader  # noqa: E402

HOPPER_FA4 = torch.cuda.is_available() and attn_fa4.available(torch.device("cuda"),
                                                              torch.bfloat16)


def test_fa4_is_refused_where_it_cannot_run(tiny):
    """On the CPU (CI) 'fa4' is not available, not the default, and a reader asking for it is
    refused naming the attentions it could have."""
    assert "fa4" in ATTENTIONS
    assert not attn_fa4.available(torch.device("cpu"), torch.bfloat16)
    assert default_attention(torch.device("cpu"), torch.float32) == "sdpa"
    with pytest.raises(ValueError, match="'fa4' there on Hopper"):
        Reader(tiny, grid=64, cuda_graphs=True, attention="fa4")


def test_split_plan_fills_the_gpu_once_and_depends_on_the_shape_only():
    # a 512-id chunk of random:qwen3.5-0.8b at 16k: 32 tiles, 4 splits of 3,968 keys
    assert attn_fa4.split_plan(16384 - 512, 512, 8, 2, 132) == (4, 3968)
    assert attn_fa4.split_plan(100352, 1, 8, 2, 132) == (64, 1536)     # decode: 2 tiles
    assert attn_fa4.split_plan(32768, 768, 8, 2, 132) == (2, 16384)    # a question bucket
    assert attn_fa4.split_plan(1500, 512, 8, 2, 132) == (0, 0)         # one causal call
    assert attn_fa4.split_plan(16384, 4096, 8, 2, 132) == (0, 0)       # tiles fill the GPU
    for pos in (2048, 5000, 77777):
        s, ls = attn_fa4.split_plan(pos, 512, 8, 2, 132)
        assert s * ls <= pos and ls % 128 == 0 and ls >= attn_fa4.MIN_SPLIT_KEYS - 128




@pytest.mark.skipif(torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the CPU run of the split logic, Triton interpreted")
@pytest.mark.parametrize("t,pos", [(64, 0), (64, 896), (64, 7040), (64, 3008)])
def test_split_attention_over_pages_equals_whole_attention(monkeypatch, t, pos):
    """The splits, the causal tail and the combine (Triton's interpreter) over shuffled pages
    against the twin over the gathered rows, with FA4 replaced by an fp32 reference of its
    contract; the second call of each kind goes straight to the recorded kernel and gives
    the same bits, and so do other page orders."""
    pytest.importorskip("triton")
    fake_package(monkeypatch)
    k_pool, v_pool, pages, k_rows, v_rows = fa4_pools(pos + t, pos + t)
    q = torch.randn(t, 8, 32, generator=torch.Generator().manual_seed(pos))
    out, again = torch.empty(t, 8 * 32), torch.empty(t, 8 * 32)
    attn = attn_fa4.FA4Attention(8, 2)
    plan = attn.plan(pos, t, pages, FA4_PAGE, torch.device("cpu"))
    attn.attend(q, pos, k_pool, v_pool, plan, out)
    assert attn.num_direct_calls == 0
    want = attend_ref(q, k_rows, v_rows, pos)
    assert torch.allclose(out, want, atol=2e-5, rtol=1e-4)
    split = attn_fa4.split_plan(pos, t, 8, 2, 132)[0]
    assert split == plan.splits[0] and split >= (2 if pos >= 512 else 0)
    attn.attend(q, pos, k_pool, v_pool, plan, again)
    assert attn.num_direct_calls == (2 if split else 1)
    assert torch.equal(out, again)
    for entry in attn._direct.values():     # the recorded arguments keep no tensor alive
        assert not any(isinstance(a, torch.Tensor) for a in entry[1])
    k2, v2, pages2, *_ = fa4_pools(pos + t, pos + t, spare=7)        # same rows, other places
    other = torch.empty_like(out)
    attn.attend(q, pos, k2, v2, attn.plan(pos, t, pages2, FA4_PAGE, torch.device("cpu")), other)
    assert torch.equal(out, other)


def test_direct_calls_only_for_the_versions_checked(monkeypatch):
    """Another flash-attn-4 version stays on the package's own path (same bits, slower)."""
    pytest.importorskip("triton")
    fwd = fake_package(monkeypatch)
    monkeypatch.setattr(attn_fa4, "package_version", lambda: "4.1.0 cute-dsl 4.9.0")
    calls = []
    monkeypatch.setattr(fwd, "compile_cache", type("C", (dict,), {
        "__getitem__": lambda self, k: (calls.append(k), dict.__getitem__(self, k))[1]})())
    k_pool, v_pool, pages, *_ = fa4_pools(128, 0)
    attn = attn_fa4.FA4Attention(8, 2)
    q = torch.randn(64, 8, 32)
    for _ in range(3):
        attn.attend(q, 64, k_pool, v_pool, attn.plan(64, 64, pages, FA4_PAGE,
                                                     torch.device("cpu")), torch.empty(64, 256))
    assert attn.num_direct_calls == 0 and len(calls) == 3


@pytest.mark.parametrize("change,match", [
    (dict(pos=0), "a plan for"), (dict(out=torch.empty(64, 255)), "shapes"),
    (dict(k=torch.randn(3, FA4_PAGE, 3, 32)), "shapes|pools"),
    (dict(v=torch.randn(3, FA4_PAGE, 2, 32).double()), "pools|dtypes"),
    (dict(out=torch.empty(256, 64).t()), "shapes"), (dict(k=torch.randn(3, 96, 2, 32)), "pools")])
def test_bad_input_is_refused_before_any_kernel(monkeypatch, change, match):
    monkeypatch.setattr(attn_fa4, "_forward", lambda: pytest.fail("a kernel ran"))
    monkeypatch.setattr(attn_fa4, "_num_sms", lambda index: 132)
    attn = attn_fa4.FA4Attention(8, 2)
    args = dict(q=torch.randn(64, 8, 32), pos=64, k=torch.randn(3, FA4_PAGE, 2, 32),
                v=torch.randn(3, FA4_PAGE, 2, 32), out=torch.empty(64, 256),
                plan=attn.plan(64, 64, [2, 0], FA4_PAGE, torch.device("cpu")))
    args.update(change)
    with pytest.raises(ValueError, match=match):
        attn.attend(args["q"], args["pos"], args["k"], args["v"], args["plan"], args["out"])


def test_a_plan_off_the_sub_pages_is_refused():
    with pytest.raises(ValueError, match="sub-pages of 64"):
        attn_fa4.FA4Attention(8, 2).plan(64, 37, [0, 1], FA4_PAGE, torch.device("cpu"))


def test_a_tiling_or_an_attention_without_the_runners_is_refused(tiny):
    with pytest.raises(ValueError, match="cuda_graphs off"):
        Reader(tiny, grid=64, cuda_graphs=False, attention="table")
    with pytest.raises(ValueError, match="'flash'.*reads no page table.*use 'table'"):
        Reader(tiny, grid=64, attention="flash")            # removed with the pages
    from adapters.attention.table import READ
    from adapters.runners.runners import Runners
    with pytest.raises(ValueError, match="table attention's"):
        Runners(tiny, 64, attention="sdpa", split=READ)
    with pytest.raises(ValueError, match="fused_ops=True"):
        Reader(tiny, grid=64, cuda_graphs=False, fused_ops=True)
    with pytest.raises(ValueError, match="must be an attention.tiling.SplitConfig"):
        Reader(tiny, grid=64, cuda_graphs=True, attn_split="64x64x4x2")
    from adapters.attention.table import SplitConfig
    for bad in ("0x0x0x0", "-64x64x4x2", "7x64x4x2", "64x64x3x2"):
        with pytest.raises(ValueError, match="powers of two"):
            SplitConfig.parse(bad)


@pytest.mark.skipif(torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1",
                    reason="Triton's interpreter on the CPU")
def test_combine_kernel_matches_its_twin():
    pytest.importorskip("triton")
    from adapters.attention.combine import combine_lse
    g = torch.Generator().manual_seed(3)
    o_part = torch.randn(5, 7, 4, 32, generator=g).half()
    lse = torch.randn(5, 4, 7, generator=g) * 4
    lse[2, 1, 3] = -1e4                                   # a split that barely counts
    out = torch.empty(7, 4 * 32, dtype=torch.half)
    combine_lse(o_part, lse, out)
    want = attn_combine.combine_ref(o_part, lse)
    assert torch.allclose(out.float(), want.float(), atol=2e-3, rtol=2e-3)


def test_combine_refuses_layouts_it_cannot_read():
    """combine_lse checks its tensors' shapes and layouts on the host before any kernel."""
    pytest.importorskip("triton")
    from adapters.attention.combine import combine_lse
    o_part = torch.zeros(3, 8, 2, 16)
    out = torch.empty(8, 32)
    for lse in (torch.zeros(3, 8, 2).transpose(1, 2),      # [S1, H, T], not contiguous
                torch.zeros(3, 2, 7),                        # T of 7 rows, not 8
                torch.zeros(3, 2, 2, 4),                     # [S1, B, H, t]: not read
                torch.zeros(3, 2, 8, dtype=torch.float16)):  # not fp32
        with pytest.raises(ValueError, match="combine_lse takes"):
            combine_lse(o_part, lse, out)
    with pytest.raises(ValueError, match="combine_lse takes"):
        combine_lse(o_part.transpose(1, 2), torch.zeros(3, 2, 8), out)
    with pytest.raises(ValueError, match="combine_lse takes"):
        combine_lse(o_part, torch.zeros(3, 2, 8), torch.empty(8, 64)[:, :32])
