"""model.attn_fa4 (FlashAttention-4's Hopper forward, flash-attn-4, over KV pages) against its
pure-torch twin ref.attend_ref over the gathered rows and FlashAttention-2 on real-shaped heads:
on a Hopper GPU with the package only
(skipped elsewhere). Where it cannot run, asking for it is refused with the reason. The same
checks, with timings, ran on the H200 in evals/fa4_probe.py at cadb457."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():               # the combine kernel through Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from adapters.model import attn_fa4, fa4_plan  # noqa: E402
from adapters.model.graphs import ATTENTIONS, default_attention  # noqa: E402
from adapters.model.ref import attend_ref  # noqa: E402
from shadow_plugin.reader import Reader  # noqa: E402

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


def _ref_forward(q, k, v, causal, out, lse=None, page_table=None, seqused_k=None, **_):
    """What attn_fa4 asks of flash_attn.cute's forward, in fp32: q [B, T, H, D], k, v pools
    [num_pages, P, Hkv, D] read through page_table [B, n] (sequence b: pages page_table[b],
    its first seqused_k[b] rows when given), causal bottom-right aligned; writes out and the
    natural-log lse [B, H, T]."""
    if seqused_k is not None:                     # one sequence at a time, of its own length
        for i, n in enumerate(seqused_k.tolist()):
            width = -(-n // k.shape[1])
            _ref_forward(q[i:i + 1], k, v, causal, out[i:i + 1], None if lse is None else
                         lse[i:i + 1], page_table[i:i + 1, :width], None, rows=n)
        return
    rows = _.get("rows")
    k, v = k[page_table.long()].flatten(1, 2), v[page_table.long()].flatten(1, 2)
    if rows is not None:
        k, v = k[:, :rows].contiguous(), v[:, :rows].contiguous()
    b, t, h, d = q.shape
    big = k.shape[1]
    g = h // k.shape[2]
    kk, vv = k.float().repeat_interleave(g, 2), v.float().repeat_interleave(g, 2)
    sc = torch.einsum("bthd,blhd->bhtl", q.float(), kk) * d ** -0.5
    if causal:
        vis = torch.arange(big)[None, :] <= big - t + torch.arange(t)[:, None]
        sc = sc.masked_fill(~vis, float("-inf"))
    out.copy_(torch.einsum("bhtl,blhd->bthd", sc.softmax(-1), vv).to(out.dtype))
    if lse is not None:
        lse.copy_(sc.logsumexp(-1))


def _fake_package(monkeypatch):
    """flash_attn.cute.interface as far as attn_fa4 uses it: `_flash_attn_fwd` finds its
    kernel in `_flash_attn_fwd.compile_cache` and calls it with the tensors at the front of
    its arguments, then constants (what flash-attn-4 4.0.0b36 does on SM90)."""
    import types

    def compile_kernel(causal):
        def kernel(q, k, v, page_table, out, lse, scale, seqused_k, *rest):
            assert scale == q.shape[-1] ** -0.5 and all(x is None for x in rest)
            _ref_forward(q, k, v, causal, out, lse, page_table, seqused_k)
        return kernel

    def fwd(q, k, v, causal, out, lse=None, page_table=None, tile_mn=None, seqused_k=None,
            **_):
        assert tile_mn == attn_fa4.TILE_MN and k.shape[1] == tile_mn[1]   # TMA's page size
        key = (causal, lse is None, seqused_k is None)
        if key not in fwd.compile_cache:
            fwd.compile_cache[key] = compile_kernel(causal)
        fwd.compile_cache[key](q.detach(), k.detach(), v.detach(), page_table, out.detach(),
                               lse, q.shape[-1] ** -0.5, seqused_k, None, None)

    fwd.compile_cache = {}
    mods = {n: types.ModuleType(n) for n in ("flash_attn", "flash_attn.cute",
                                             "flash_attn.cute.interface")}
    mods["flash_attn"].cute = mods["flash_attn.cute"]
    mods["flash_attn.cute"].interface = mods["flash_attn.cute.interface"]
    mods["flash_attn.cute.interface"]._flash_attn_fwd = fwd
    for name, mod in mods.items():
        monkeypatch.setitem(__import__("sys").modules, name, mod)
    monkeypatch.setattr(attn_fa4, "_forward", lambda: fwd)
    monkeypatch.setattr(attn_fa4, "_num_sms", lambda index: 132)
    monkeypatch.setattr(fa4_plan, "MIN_SPLIT_KEYS", 256)        # split_plan reads it there
    monkeypatch.setattr(attn_fa4, "package_version", lambda: "4.0.0b36 cute-dsl 4.8.1")
    return fwd


PAGE = 128      # rows a page in these tests: 2 sub-pages of 64 as FA4 reads them


def _pools(rows, seed, d=32, device="cpu", dtype=torch.float32, spare=3):
    """K and V pools of PAGE-row pages holding `rows` rows (values from `seed`) in an order
    and among spare pages of noise that depend on `spare`: (k_pool, v_pool, pages, k_rows,
    v_rows)."""
    g = torch.Generator(device=device).manual_seed(seed)
    n = -(-rows // PAGE)
    k_rows, v_rows = (torch.randn(n, PAGE, 2, d, device=device, generator=g).to(dtype)
                      for _ in "kv")
    pages = torch.randperm(n + spare, generator=torch.Generator().manual_seed(spare))[:n]
    pools = []
    for x in (k_rows, v_rows):
        pool = torch.randn(n + spare, PAGE, 2, d, device=device).to(dtype)
        pool[pages.to(device)] = x
        pools.append(pool)
    return (pools[0], pools[1], pages.tolist(), k_rows.flatten(0, 1)[:rows],
            v_rows.flatten(0, 1)[:rows])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU run of the split logic")
@pytest.mark.parametrize("t,pos", [(64, 0), (64, 896), (64, 7040), (64, 3008)])
def test_split_attention_over_pages_equals_whole_attention(monkeypatch, t, pos):
    """The splits, the causal tail and the combine (Triton's interpreter) over shuffled pages
    against the twin over the gathered rows, with FA4 replaced by an fp32 reference of its
    contract; the second call of each kind goes straight to the recorded kernel and gives
    the same bits, and so do other page orders."""
    pytest.importorskip("triton")
    _fake_package(monkeypatch)
    k_pool, v_pool, pages, k_rows, v_rows = _pools(pos + t, pos + t)
    q = torch.randn(t, 8, 32, generator=torch.Generator().manual_seed(pos))
    out, again = torch.empty(t, 8 * 32), torch.empty(t, 8 * 32)
    attn = attn_fa4.FA4Attention(8, 2)
    plan = attn.plan(pos, t, pages, PAGE, torch.device("cpu"))
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
    k2, v2, pages2, *_ = _pools(pos + t, pos + t, spare=7)        # same rows, other places
    other = torch.empty_like(out)
    attn.attend(q, pos, k2, v2, attn.plan(pos, t, pages2, PAGE, torch.device("cpu")), other)
    assert torch.equal(out, other)


def test_direct_calls_only_for_the_versions_checked(monkeypatch):
    """Another flash-attn-4 version stays on the package's own path (same bits, slower)."""
    pytest.importorskip("triton")
    fwd = _fake_package(monkeypatch)
    monkeypatch.setattr(attn_fa4, "package_version", lambda: "4.1.0 cute-dsl 4.9.0")
    calls = []
    monkeypatch.setattr(fwd, "compile_cache", type("C", (dict,), {
        "__getitem__": lambda self, k: (calls.append(k), dict.__getitem__(self, k))[1]})())
    k_pool, v_pool, pages, *_ = _pools(128, 0)
    attn = attn_fa4.FA4Attention(8, 2)
    q = torch.randn(64, 8, 32)
    for _ in range(3):
        attn.attend(q, 64, k_pool, v_pool, attn.plan(64, 64, pages, PAGE,
                                                     torch.device("cpu")), torch.empty(64, 256))
    assert attn.num_direct_calls == 0 and len(calls) == 3


@pytest.mark.parametrize("change,match", [
    (dict(pos=0), "a plan for"), (dict(out=torch.empty(64, 255)), "shapes"),
    (dict(k=torch.randn(3, PAGE, 3, 32)), "shapes|pools"),
    (dict(v=torch.randn(3, PAGE, 2, 32).double()), "pools|dtypes"),
    (dict(out=torch.empty(256, 64).t()), "shapes"), (dict(k=torch.randn(3, 96, 2, 32)), "pools")])
def test_bad_input_is_refused_before_any_kernel(monkeypatch, change, match):
    monkeypatch.setattr(attn_fa4, "_forward", lambda: pytest.fail("a kernel ran"))
    monkeypatch.setattr(attn_fa4, "_num_sms", lambda index: 132)
    attn = attn_fa4.FA4Attention(8, 2)
    args = dict(q=torch.randn(64, 8, 32), pos=64, k=torch.randn(3, PAGE, 2, 32),
                v=torch.randn(3, PAGE, 2, 32), out=torch.empty(64, 256),
                plan=attn.plan(64, 64, [2, 0], PAGE, torch.device("cpu")))
    args.update(change)
    with pytest.raises(ValueError, match=match):
        attn.attend(args["q"], args["pos"], args["k"], args["v"], args["plan"], args["out"])


def test_a_plan_off_the_sub_pages_is_refused():
    with pytest.raises(ValueError, match="sub-pages of 64"):
        attn_fa4.FA4Attention(8, 2).plan(64, 37, [0, 1], PAGE, torch.device("cpu"))


def test_a_tiling_or_an_attention_without_the_runners_is_refused(tiny):
    with pytest.raises(ValueError, match="cuda_graphs off"):
        Reader(tiny, grid=64, cuda_graphs=False, attention="table")
    with pytest.raises(ValueError, match="'flash'.*reads no page table.*use 'table'"):
        Reader(tiny, grid=64, attention="flash")            # removed with the pages
    from adapters.model.attn_triton import READ
    from adapters.model.runners import Runners
    with pytest.raises(ValueError, match="table attention's"):
        Runners(tiny, 64, attention="sdpa", split=READ)
    with pytest.raises(ValueError, match="fused_ops=True"):
        Reader(tiny, grid=64, cuda_graphs=False, fused_ops=True)
    with pytest.raises(ValueError, match="must be an attn_triton.SplitConfig"):
        Reader(tiny, grid=64, cuda_graphs=True, attn_split="64x64x4x2")
    from adapters.model.attn_triton import SplitConfig
    for bad in ("0x0x0x0", "-64x64x4x2", "7x64x4x2", "64x64x3x2"):
        with pytest.raises(ValueError, match="powers of two"):
            SplitConfig.parse(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="Triton's interpreter on the CPU")
def test_combine_kernel_matches_its_twin():
    pytest.importorskip("triton")
    from adapters.model.attn_combine import combine_lse
    g = torch.Generator().manual_seed(3)
    o_part = torch.randn(5, 7, 4, 32, generator=g).half()
    lse = torch.randn(5, 4, 7, generator=g) * 4
    lse[2, 1, 3] = -1e4                                   # a split that barely counts
    out = torch.empty(7, 4 * 32, dtype=torch.half)
    combine_lse(o_part, lse, out)
    want = attn_fa4.combine_ref(o_part, lse)
    assert torch.allclose(out.float(), want.float(), atol=2e-3, rtol=2e-3)


def _fa2(q, pos: int, k_rows, v_rows) -> torch.Tensor:
    """A peer: torch's FlashAttention-2 over contiguous rows [0, pos + T) (bottom-right causal,
    grouped heads natively), [T, H * D]."""
    t, end = q.shape[0], pos + q.shape[0]
    o = torch.ops.aten._flash_attention_forward.default(
        q.contiguous()[None], k_rows[:end][None], v_rows[:end][None], None, None, t, end, 0.0,
        True, False)[0]
    return o.view(t, -1)


def _rel(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()


@pytest.mark.skipif(not HOPPER_FA4, reason="FA4's SM90 forward needs a Hopper GPU and "
                    "flash-attn-4")
@pytest.mark.parametrize("t,pos", [(512, 0), (512, 7680), (768, 32768), (256, 5120)])
def test_fa4_over_pages_matches_the_twin_and_ignores_where_pages_lie(t, pos):
    dev = torch.device("cuda")
    k_pool, v_pool, pages, k_rows, v_rows = _pools(pos + t, pos, 256, dev, torch.bfloat16)
    q = torch.randn(t, 8, 256, device=dev, generator=torch.Generator(device=dev).manual_seed(1)
                    ).bfloat16()
    out = torch.empty(t, 8 * 256, device=dev, dtype=torch.bfloat16)
    attn = attn_fa4.FA4Attention(8, 2)
    attn.attend(q, pos, k_pool, v_pool, attn.plan(pos, t, pages, PAGE, dev), out)
    want = attend_ref(q, k_rows, v_rows, pos)
    assert _rel(out, want) < 5e-3                       # bf16 P.V; FA2 measured 2.0-2.5e-3
    assert _rel(out, _fa2(q, pos, k_rows.contiguous(), v_rows.contiguous())) < 5e-3
    k2, v2, pages2, *_ = _pools(pos + t, pos, 256, dev, torch.bfloat16, spare=9)
    again = torch.empty_like(out)
    attn.attend(q, pos, k2, v2, attn.plan(pos, t, pages2, PAGE, dev), again)
    assert torch.equal(out, again)                      # bits independent of the places
    assert attn.num_direct_calls > 0                    # the recorded kernels were called
    slow = torch.empty_like(out)
    fresh = attn_fa4.FA4Attention(8, 2)
    fresh.attend(q, pos, k_pool, v_pool, fresh.plan(pos, t, pages, PAGE, dev), slow)
    assert torch.equal(out, slow)                       # direct calls: the package's bits
    serial = attn_fa4.FA4Attention(8, 2, overlap=False)  # the splits and the tail on one stream
    alone = torch.empty_like(out)
    serial.attend(q, pos, k_pool, v_pool, serial.plan(pos, t, pages, PAGE, dev), alone)
    assert torch.equal(out, alone)
    # the overlapped calls wait for the caller's stream: q written there late, behind a sleep,
    # and the caller's next allocations filled at once, give the same bits
    plan, late, busy = attn.plan(pos, t, pages, PAGE, dev), torch.empty_like(q), []
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)
    late.copy_(q)
    attn.attend(late, pos, k_pool, v_pool, plan, again)
    for _ in range(4):
        busy.append(torch.full((4 * t, 8, 256), 7.0, device=dev, dtype=torch.bfloat16))
    assert torch.equal(out, again)
    # the overlapped path was the one run where there are splits (none at pos 0)
    assert bool(attn._streams) == (attn.overlap and attn_fa4.split_plan(
        pos, t, 8, 2, attn_fa4._num_sms(0))[0] > 0)


def test_the_pin_folder_keeps_fa4s_compiled_kernels(tmp_path):
    """autotune.pin turns FA4's on-disk kernel cache on, in path/fa4, unless the user set
    either variable (read when flash_attn.cute is imported, after the pin)."""
    import subprocess
    import sys
    code = ("import os; from adapters.model import autotune; autotune.pin(%r);"
            "print(os.environ[autotune.FA4_CACHE_ENABLED], os.environ[autotune.FA4_CACHE_DIR])"
            % str(tmp_path / "picks"))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FLA_", "FLASH_ATTENTION_", "TORCHINDUCTOR_"))}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["1", str(tmp_path.resolve() / "picks" / "fa4")]
    env["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] = str(tmp_path / "mine")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["1", str(tmp_path / "mine")]

