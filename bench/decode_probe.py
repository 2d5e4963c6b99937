"""One decode token's attention over a session's KV rows (issue 5): FlashAttention-2 with the
query heads as they are (one call, GQA native: what attn_flash does) against a packed call (the
query heads of a KV group as that head's rows, no mask: each KV row read once per group, not
once per query head), at several context lengths; bf16, head_dim
256, 8 query / 2 KV heads (random:qwen3.5-0.8b). CUDA events, warm-up first, median of 200.
Checks that both agree within bf16 rounding. Prints a table and, last, one JSON object.

    python bench/decode_probe.py --contexts 16384,65536,100352
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from shadow_reader.bench import versions


def plain(q, keys, values):
    """The unpacked call: q [1, H, D] as one row of H heads, causal bottom-right."""
    o = torch.ops.aten._flash_attention_forward(q[None], keys[None], values[None], None, None,
                                                1, keys.shape[0], 0.0, True, False)[0]
    return o.view(1, -1)


def packed(q, keys, values):
    """q [1, H, D] as [1, H / Hkv rows, Hkv heads, D] (query head j * group + i -> row i of
    head j), no mask (the one token sees every key); back to [1, H * D]."""
    h, hkv, d = q.shape[1], keys.shape[1], q.shape[2]
    group = h // hkv
    rows = q[0].view(hkv, group, d).transpose(0, 1).contiguous()[None]
    o = torch.ops.aten._flash_attention_forward(rows, keys[None], values[None], None, None,
                                                group, keys.shape[0], 0.0, False, False)[0]
    return o[0].transpose(0, 1).reshape(1, h * d)


def time_ms(fn, n=200) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", default="16384,65536,100352")
    a = p.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = {}
    for n in [int(x) for x in a.contexts.split(",")]:
        keys, values = (torch.randn(n, 2, 256, device="cuda", generator=g).bfloat16()
                        for _ in "kv")
        q = torch.randn(1, 8, 256, device="cuda", generator=g).bfloat16()
        want, got = plain(q, keys, values), packed(q, keys, values)
        rel = ((got.float() - want.float()).norm() / want.float().norm()).item()
        rows[n] = {"plain_ms": round(time_ms(lambda: plain(q, keys, values)), 4),
                   "packed_ms": round(time_ms(lambda: packed(q, keys, values)), 4),
                   "rel_diff": rel}
        print(f"{n:>7}  {rows[n]}", flush=True)
    print(json.dumps({"decode_attention": rows, **versions()}))


if __name__ == "__main__":
    main()
