"""Single-token decode over 512-row pages with torch's FlashAttention-2 and its `block_table`
(issue 16: decode at 100k, the table attention 0.111 ms a layer against FlashAttention-2's
0.083 on contiguous rows, each call in a CUDA graph). Shapes of random:qwen3.5-0.8b (H 8,
Hkv 2, D 256), bf16, one query row at 50k and 100k context, the rows in shuffled pages.

    python -m evals.fa2_paged_probe

Per context: FlashAttention-2 on the rows contiguous; over the pages by `block_table`
(cu_seqlens [0, 1] and [0, L], max_seqlen_k L, or a larger bucket: the graph must fix it on
the host); with `seqused_k`; with `num_splits` where this torch takes it; today's DECODE.
GPU ms a call (evals.attn_kernel.graph_timed, calls in a CUDA graph), the largest difference
from the contiguous call and whether the bits depend on where pages lie. Last line: JSON.
"""
from __future__ import annotations

import json

import torch

from adapters.model import attn_flash
from adapters.model import attn_triton as at
from evals.attn_kernel import graph_timed, pool_args
from evals.bench import versions
from evals.decode_probe import DEV, DT, PAGE, pools

OP = torch.ops.aten._flash_attention_forward.default


def paged_call(q, k, v, table, ctx: int, max_k: int, out, used: bool = False,
               splits: int | None = None):
    """q [1, H, D] over the pools [n, PAGE, Hkv, D] through table [1, pages] int32."""
    cu_q = torch.tensor([0, 1], dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0, max_k if used else ctx], dtype=torch.int32, device=DEV)
    seq = torch.tensor([ctx], dtype=torch.int32, device=DEV) if used else None
    extra = {"num_splits": splits} if splits else {}

    def call():
        o = OP(q, k, v, cu_q, cu_k, 1, max_k, 0.0, False, False, scale=q.shape[-1] ** -0.5,
               seqused_k=seq, block_table=table, **extra)[0]
        out.copy_(o.view(1, -1))
    return call


def main() -> int:
    print(OP._schema, flush=True)
    res = {}
    for ctx in (51200, 102400):
        k, v, order = pools(ctx, 1)
        rows_k = k[order].flatten(0, 1)[:ctx].contiguous()
        rows_v = v[order].flatten(0, 1)[:ctx].contiguous()
        q = torch.randn(1, 8, 256, device=DEV, generator=torch.Generator(device=DEV)
                        .manual_seed(2)).to(DT)
        out = torch.empty(1, 8 * 256, device=DEV, dtype=DT)
        table = order.to(torch.int32)[None]
        calls = {"fa2_contiguous": lambda: attn_flash.attend(q, ctx - 1, rows_k, rows_v, out)}
        calls["fa2_contiguous"]()
        want = out.clone()
        bucket = -(-ctx // 16384) * 16384 + 16384
        variants = {"fa2_pages": dict(max_k=ctx), "fa2_pages_bucket": dict(max_k=bucket),
                    "fa2_pages_131072": dict(max_k=131072),
                    "fa2_pages_seqused": dict(max_k=bucket, used=True),
                    "fa2_pages_splits64": dict(max_k=bucket, splits=64),
                    "fa2_pages_splits128": dict(max_k=bucket, splits=128)}
        row = {}
        for name, kw in variants.items():
            try:
                call = paged_call(q, k, v, table, ctx, out=out, **kw)
                call()
            except (RuntimeError, TypeError) as e:
                row[name] = f"refused: {str(e).splitlines()[0][:200]}"
                continue
            got = out.clone()
            row[name + "_max_diff"] = (got.float() - want.float()).abs().max().item()
            k2, v2, order2 = pools(ctx, 3, spare=3)
            k2[order2], v2[order2] = k[order], v[order]
            paged_call(q, k2, v2, order2.to(torch.int32)[None], ctx, out=out, **kw)()
            row[name + "_same_bits_other_pages"] = torch.equal(out, got)
            del k2, v2
            calls[name] = call
        base, places = pool_args(k, v)
        pos_t = torch.tensor([ctx - 1], dtype=torch.long, device=DEV)
        o_part, l_part = at.scratch(1, 8, 256, at.DECODE, DEV)
        calls["decode"] = lambda: at.attend_table(q, base, places, pos_t, 2, o_part, l_part,
                                                  out, at.DECODE, order, PAGE)
        for _ in range(3):                                   # in turns, medians of 3 rounds
            for name, fn in calls.items():
                row.setdefault(name, []).append(graph_timed(fn))
        for name in calls:
            row[name] = sorted(row[name])[1]
        res[f"{ctx // 1024}k"] = row
        print(ctx, row, flush=True)
    print(json.dumps({"probe": "fa2_paged", "dtype": "bfloat16",
                      "gpu": torch.cuda.get_device_name(), **versions(), "results": res}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
