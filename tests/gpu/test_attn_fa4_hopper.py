"""FA4's SM90 forward over pages on a Hopper GPU against its twin and torch's FlashAttention-2 (skipped without one)."""
from __future__ import annotations

import pytest
import torch
from paged import FA4_PAGE, fa4_pools

from adapters.attention import fa4 as attn_fa4  # noqa: E402
from adapters.model.ref import attend_ref  # noqa: E402

HOPPER_FA4 = torch.cuda.is_available() and attn_fa4.available(torch.device("cuda"),
                                                              torch.bfloat16)




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
    k_pool, v_pool, pages, k_rows, v_rows = fa4_pools(pos + t, pos, 256, dev, torch.bfloat16)
    q = torch.randn(t, 8, 256, device=dev, generator=torch.Generator(device=dev).manual_seed(1)
                    ).bfloat16()
    out = torch.empty(t, 8 * 256, device=dev, dtype=torch.bfloat16)
    attn = attn_fa4.FA4Attention(8, 2)
    attn.attend(q, pos, k_pool, v_pool, attn.plan(pos, t, pages, FA4_PAGE, dev), out)
    want = attend_ref(q, k_rows, v_rows, pos)
    assert _rel(out, want) < 5e-3                       # bf16 P.V; FA2 measured 2.0-2.5e-3
    assert _rel(out, _fa2(q, pos, k_rows.contiguous(), v_rows.contiguous())) < 5e-3
    k2, v2, pages2, *_ = fa4_pools(pos + t, pos, 256, dev, torch.bfloat16, spare=9)
    again = torch.empty_like(out)
    attn.attend(q, pos, k2, v2, attn.plan(pos, t, pages2, FA4_PAGE, dev), again)
    assert torch.equal(out, again)                      # bits independent of the places
    assert attn.num_direct_calls > 0                    # the recorded kernels were called
    slow = torch.empty_like(out)
    fresh = attn_fa4.FA4Attention(8, 2)
    fresh.attend(q, pos, k_pool, v_pool, fresh.plan(pos, t, pages, FA4_PAGE, dev), slow)
    assert torch.equal(out, slow)                       # direct calls: the package's bits
    serial = attn_fa4.FA4Attention(8, 2, overlap=False)  # the splits and the tail on one stream
    alone = torch.empty_like(out)
    serial.attend(q, pos, k_pool, v_pool, serial.plan(pos, t, pages, FA4_PAGE, dev), alone)
    assert torch.equal(out, alone)
    # the overlapped calls wait for the caller's stream: q written there late, behind a sleep,
    # and the caller's next allocations filled at once, give the same bits
    plan, late, busy = attn.plan(pos, t, pages, FA4_PAGE, dev), torch.empty_like(q), []
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
