"""model.attn_flash (FlashAttention-2 through torch) against its pure-torch twin ref.attend_ref
on real-shaped heads; CUDA only (skipped elsewhere: the op has no CPU kernel). The same checks
ran on the H200 in evals/attn_probe.py (docs/attn-probe-2026-11-29.log)."""
from __future__ import annotations

import pytest
import torch

from adapters.model import attn_flash
from adapters.model.ref import attend_ref

pytestmark = pytest.mark.skipif(
    not attn_flash.available(torch.device("cuda"), torch.bfloat16)
    or not torch.cuda.is_available(), reason="FlashAttention needs CUDA")


def _case(t, pos, cap, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    k_new, v_new = (torch.randn(t, 2, 256, device="cuda", generator=g).bfloat16() for _ in "kv")
    k_buf, v_buf = (torch.randn(cap, 2, 256, device="cuda", generator=g).bfloat16() for _ in "kv")
    q = torch.randn(t, 8, 256, device="cuda", generator=g).bfloat16()
    return q, k_new, v_new, k_buf, v_buf


@pytest.mark.parametrize("t,pos", [(512, 0), (512, 7680), (37, 5000), (1, 0), (1, 9000),
                                   (1, 100000)])
def test_write_and_attend_matches_the_twin_and_ignores_capacity(t, pos):
    q, k, v, k_buf, v_buf = _case(t, pos, pos + t + 300)
    out = torch.empty(t, 8 * 256, device="cuda", dtype=torch.bfloat16)
    attn_flash.write_and_attend(q, k, v, pos, k_buf, v_buf, out)
    assert torch.equal(k_buf[pos:pos + t], k) and torch.equal(v_buf[pos:pos + t], v)
    want = attend_ref(q, k_buf, v_buf, pos)
    rel = ((out.float() - want.float()).pow(2).mean().sqrt() / want.float().pow(2).mean().sqrt())
    assert rel.item() < 5e-3                            # bf16 P.V, as measured: 2.0-2.5e-3
    small_k, small_v = k_buf[:pos + t].clone(), v_buf[:pos + t].clone()
    again = torch.empty_like(out)
    attn_flash.write_and_attend(q, k, v, pos, small_k, small_v, again)
    assert torch.equal(out, again)                      # bits independent of the capacity
