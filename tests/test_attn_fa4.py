"""model.attn_fa4 (FlashAttention-4's Hopper forward, flash-attn-4) against its pure-torch twin
ref.attend_ref and FlashAttention-2 on real-shaped heads: on a Hopper GPU with the package only
(skipped elsewhere). Where it cannot run, asking for it is refused with the reason. The same
checks, with timings, ran on the H200 in evals/fa4_probe.py."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():               # the combine kernel through Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from adapters.model import attn_fa4, attn_flash  # noqa: E402
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


def _ref_forward(q, k, v, causal, out, lse=None, **_):
    """What attn_fa4 asks of flash_attn.cute's forward, in fp32: q [B, T, H, D], k, v
    [B, L, Hkv, D], causal bottom-right aligned; writes out and the natural-log lse [B, H, T]."""
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
        def kernel(q, k, v, out, lse, scale, *rest):
            assert scale == q.shape[-1] ** -0.5 and all(x is None for x in rest)
            _ref_forward(q, k, v, causal, out, lse)
        return kernel

    def fwd(q, k, v, causal, out, lse=None, **_):
        key = (causal, lse is None)
        if key not in fwd.compile_cache:
            fwd.compile_cache[key] = compile_kernel(causal)
        fwd.compile_cache[key](q.detach(), k.detach(), v.detach(), out.detach(), lse,
                               q.shape[-1] ** -0.5, None, None, None)

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
    monkeypatch.setattr(attn_fa4, "MIN_SPLIT_KEYS", 256)
    monkeypatch.setattr(attn_fa4, "package_version", lambda: "4.0.0b36 cute-dsl 4.8.1")
    return fwd


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU run of the split logic")
@pytest.mark.parametrize("t,pos", [(32, 0), (32, 900), (64, 7000), (48, 3000)])
def test_split_attention_equals_whole_attention(monkeypatch, t, pos):
    """The splits, the causal tail and the combine (Triton's interpreter) against the twin,
    with FA4 replaced by an fp32 reference of its contract; the second call of each kind goes
    straight to the recorded kernel and gives the same bits."""
    pytest.importorskip("triton")
    _fake_package(monkeypatch)
    g = torch.Generator().manual_seed(pos + t)
    k_buf, v_buf = (torch.randn(pos + t + 9, 2, 32, generator=g) for _ in "kv")
    q = torch.randn(t, 8, 32, generator=g)
    out, again = torch.empty(t, 8 * 32), torch.empty(t, 8 * 32)
    attn = attn_fa4.FA4Attention()
    attn.attend(q, pos, k_buf, v_buf, out)
    assert attn.num_direct_calls == 0
    want = attend_ref(q, k_buf, v_buf, pos)
    assert torch.allclose(out, want, atol=2e-5, rtol=1e-4)
    split = attn_fa4.split_plan(pos, t, 8, 2, 132)[0]
    assert split >= (2 if pos >= 512 else 0)
    attn.attend(q, pos, k_buf, v_buf, again)
    assert attn.num_direct_calls == (2 if split else 1)
    assert torch.equal(out, again)
    for entry in attn._direct.values():     # the recorded arguments keep no tensor alive
        assert not any(isinstance(a, torch.Tensor) for a in entry[1])


def test_direct_calls_only_for_the_versions_checked(monkeypatch):
    """Another flash-attn-4 version stays on the package's own path (same bits, slower)."""
    pytest.importorskip("triton")
    fwd = _fake_package(monkeypatch)
    monkeypatch.setattr(attn_fa4, "package_version", lambda: "4.1.0 cute-dsl 4.9.0")
    calls = []
    monkeypatch.setattr(fwd, "compile_cache", type("C", (dict,), {
        "__getitem__": lambda self, k: (calls.append(k), dict.__getitem__(self, k))[1]})())
    q, kv = torch.randn(32, 8, 32), torch.randn(100, 2, 32)
    attn = attn_fa4.FA4Attention()
    for _ in range(3):
        attn.attend(q, 40, kv, kv, torch.empty(32, 256))
    assert attn.num_direct_calls == 0 and len(calls) == 3


@pytest.mark.parametrize("change,match", [
    (dict(pos=-1), "rows"), (dict(pos=80), "rows"), (dict(out=torch.empty(32, 255)), "shapes"),
    (dict(k=torch.randn(100, 3, 32)), "shapes"), (dict(v=torch.randn(100, 2, 32).double()),
                                                  "rows|dtypes"),
    (dict(out=torch.empty(256, 32).t()), "shapes")])
def test_bad_input_is_refused_before_any_kernel(monkeypatch, change, match):
    monkeypatch.setattr(attn_fa4, "_forward", lambda: pytest.fail("a kernel ran"))
    args = dict(q=torch.randn(32, 8, 32), pos=40, k=torch.randn(100, 2, 32),
                v=torch.randn(100, 2, 32), out=torch.empty(32, 256))
    args.update(change)
    with pytest.raises(ValueError, match=match):
        attn_fa4.FA4Attention().attend(args["q"], args["pos"], args["k"], args["v"],
                                       args["out"])


def test_a_tiling_or_an_attention_without_the_runners_is_refused(tiny):
    with pytest.raises(ValueError, match="cuda_graphs off"):
        Reader(tiny, grid=64, cuda_graphs=False, attention="flash")
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


def test_fewer_rows_than_a_tile_go_to_flash_attention_2(monkeypatch):
    """Single-token decode (4 rows of a 128-row tile) is FlashAttention-2's."""
    seen = []
    monkeypatch.setattr(attn_flash, "attend", lambda *a: seen.append(a[1]))
    monkeypatch.setattr(attn_fa4, "_forward", lambda: pytest.fail("FA4 called"))
    q, kv = torch.randn(1, 8, 32), torch.randn(50, 2, 32)
    attn_fa4.FA4Attention().attend(q, 41, kv, kv, torch.empty(1, 256))
    assert seen == [41]


@pytest.mark.skipif(torch.cuda.is_available(), reason="Triton's interpreter on the CPU")
def test_combine_kernel_matches_its_twin():
    pytest.importorskip("triton")
    from adapters.model.attn_triton import combine_lse
    g = torch.Generator().manual_seed(3)
    o_part = torch.randn(5, 7, 4, 32, generator=g).half()
    lse = torch.randn(5, 4, 7, generator=g) * 4
    lse[2, 1, 3] = -1e4                                   # a split that barely counts
    out = torch.empty(7, 4 * 32, dtype=torch.half)
    combine_lse(o_part, lse, out)
    want = attn_fa4.combine_ref(o_part, lse)
    assert torch.allclose(out.float(), want.float(), atol=2e-3, rtol=2e-3)


def _case(t, pos, cap, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    k_buf, v_buf = (torch.randn(cap, 2, 256, device="cuda", generator=g).bfloat16() for _ in "kv")
    q = torch.randn(t, 8, 256, device="cuda", generator=g).bfloat16()
    return q, k_buf, v_buf


def _rel(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()


@pytest.mark.skipif(not HOPPER_FA4, reason="FA4's SM90 forward needs a Hopper GPU and "
                    "flash-attn-4")
@pytest.mark.parametrize("t,pos", [(512, 0), (512, 7680), (768, 32768), (37, 5000), (1, 0),
                                   (1, 9000), (1, 100000)])
def test_fa4_matches_the_twin_and_ignores_capacity(t, pos):
    q, k_buf, v_buf = _case(t, pos, pos + t + 300)
    out = torch.empty(t, 8 * 256, device="cuda", dtype=torch.bfloat16)
    attn = attn_fa4.FA4Attention()
    attn.attend(q, pos, k_buf, v_buf, out)
    want = attend_ref(q, k_buf, v_buf, pos)
    assert _rel(out, want) < 5e-3                       # bf16 P.V; FA2 measured 2.0-2.5e-3
    fa2 = torch.empty_like(out)
    attn_flash.attend(q, pos, k_buf, v_buf, fa2)
    assert _rel(out, fa2) < 5e-3
    again = torch.empty_like(out)
    attn.attend(q, pos, k_buf[:pos + t].clone(), v_buf[:pos + t].clone(), again)
    assert torch.equal(out, again)                      # bits independent of the capacity
    direct = attn.num_direct_calls
    assert direct > 0 or t == 1                         # the recorded kernels were called
    slow = torch.empty_like(out)
    attn_fa4.FA4Attention().attend(q, pos, k_buf, v_buf, slow)   # through the package
    assert torch.equal(out, slow)                       # direct calls: the package's bits


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

