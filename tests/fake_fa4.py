"""Test helper: flash-attn-4's package faked as far as adapters.attention.fa4 uses it, over a
pure-torch forward (`ref_forward`), so FA4's plans, recordings and graphs run on any machine."""
import sys
import types

import torch

from adapters.attention import fa4 as attn_fa4
from adapters.attention import fa4_plan


def ref_forward(q, k, v, causal, out, lse=None, page_table=None, seqused_k=None, **_):
    """What attention.fa4 asks of flash_attn.cute's forward, in fp32: q [B, T, H, D], k, v pools
    [num_pages, P, Hkv, D] read through page_table [B, n] (sequence b: pages page_table[b],
    its first seqused_k[b] rows when given), causal bottom-right aligned; writes out and the
    natural-log lse [B, H, T]."""
    if seqused_k is not None:                     # one sequence at a time, of its own length
        for i, n in enumerate(seqused_k.tolist()):
            width = -(-n // k.shape[1])
            ref_forward(q[i:i + 1], k, v, causal, out[i:i + 1], None if lse is None else
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


def fake_package(monkeypatch):
    """flash_attn.cute.interface as far as attention.fa4 uses it: `_flash_attn_fwd` finds its
    kernel in `_flash_attn_fwd.compile_cache` and calls it with the tensors at the front of
    its arguments, then constants (what flash-attn-4 4.0.0b36 does on SM90)."""
    def compile_kernel(causal):
        def kernel(q, k, v, page_table, out, lse, scale, seqused_k, *rest):
            assert scale == q.shape[-1] ** -0.5 and all(x is None for x in rest)
            ref_forward(q, k, v, causal, out, lse, page_table, seqused_k)
        return kernel

    def fwd(q, k, v, causal, out, lse=None, page_table=None, tile_mn=None, seqused_k=None,
            **_):
        assert tile_mn == attn_fa4.TILE_MN and k.shape[1] == tile_mn[1]   # TMA's page size
        assert seqused_k is None or (seqused_k.dtype == torch.int32 and
                                     seqused_k.stride(0) == 1)   # as flash-attn-4 asserts
        assert page_table is None or page_table.stride(-1) == 1
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
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(attn_fa4, "_forward", lambda: fwd)
    monkeypatch.setattr(attn_fa4, "_num_sms", lambda index: 132)
    monkeypatch.setattr(fa4_plan, "MIN_SPLIT_KEYS", 256)        # split_plan reads it there
    monkeypatch.setattr(attn_fa4, "package_version", lambda: "4.0.0b36 cute-dsl 4.8.1")
    return fwd
