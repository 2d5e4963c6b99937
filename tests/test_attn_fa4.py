"""model.attn_fa4 (FlashAttention-4's Hopper forward, flash-attn-4) against its pure-torch twin
ref.attend_ref and FlashAttention-2 on real-shaped heads: on a Hopper GPU with the package only
(skipped elsewhere). Where it cannot run, asking for it is refused with the reason. The same
checks, with timings, ran on the H200 in bench/fa4_probe.py."""
from __future__ import annotations

import pytest
import torch

from shadow_reader.model import attn_fa4, attn_flash
from shadow_reader.model.graphs import ATTENTIONS, default_attention
from shadow_reader.model.ref import attend_ref
from shadow_reader.reader import Reader

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
