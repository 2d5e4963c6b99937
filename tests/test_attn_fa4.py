"""model.attn_fa4 (FlashAttention-4's Hopper forward, flash-attn-4) against its pure-torch twin
ref.attend_ref and FlashAttention-2 on real-shaped heads: on a Hopper GPU with the package only
(skipped elsewhere). Where it cannot run, asking for it is refused with the reason. The same
checks, with timings, ran on the H200 in bench/fa4_probe.py."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():               # the combine kernel through Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from shadow_reader.model import attn_fa4, attn_flash  # noqa: E402
from shadow_reader.model.graphs import ATTENTIONS, default_attention  # noqa: E402
from shadow_reader.model.ref import attend_ref  # noqa: E402
from shadow_reader.reader import Reader  # noqa: E402

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


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU run of the split logic")
@pytest.mark.parametrize("t,pos", [(16, 0), (16, 900), (16, 5000), (1, 7000), (48, 3000)])
def test_split_attention_equals_whole_attention(monkeypatch, t, pos):
    """The splits, the causal tail and the combine (Triton's interpreter) against the twin,
    with FA4's forward replaced by an fp32 reference of its contract."""
    pytest.importorskip("triton")
    monkeypatch.setattr(attn_fa4, "_forward", lambda: _ref_forward)
    monkeypatch.setattr(attn_fa4, "_num_sms", lambda index: 132)
    monkeypatch.setattr(attn_fa4, "MIN_SPLIT_KEYS", 256)
    g = torch.Generator().manual_seed(pos + t)
    k_buf, v_buf = (torch.randn(pos + t + 9, 2, 32, generator=g) for _ in "kv")
    q = torch.randn(t, 8, 32, generator=g)
    out = torch.empty(t, 8 * 32)
    attn_fa4.attend(q, pos, k_buf, v_buf, out)
    want = attend_ref(q, k_buf, v_buf, pos)
    assert torch.allclose(out, want, atol=2e-5, rtol=1e-4)
    assert attn_fa4.split_plan(pos, t, 8, 2, 132)[0] >= (2 if pos >= 512 else 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="Triton's interpreter on the CPU")
def test_combine_kernel_matches_its_twin():
    pytest.importorskip("triton")
    from shadow_reader.model.attn_triton import combine_lse
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
    attn_fa4.attend(q, pos, k_buf, v_buf, out)
    want = attend_ref(q, k_buf, v_buf, pos)
    assert _rel(out, want) < 5e-3                       # bf16 P.V; FA2 measured 2.0-2.5e-3
    fa2 = torch.empty_like(out)
    attn_flash.attend(q, pos, k_buf, v_buf, fa2)
    assert _rel(out, fa2) < 5e-3
    again = torch.empty_like(out)
    attn_fa4.attend(q, pos, k_buf[:pos + t].clone(), v_buf[:pos + t].clone(), again)
    assert torch.equal(out, again)                      # bits independent of the capacity
    attn_fa4.attend(q, pos, k_buf, v_buf, again)
    assert torch.equal(out, again)                      # and of the call: deterministic
