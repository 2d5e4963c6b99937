"""FlashAttention-4 between a chunk's graphs (model.attn_fa4.FA4Attention.attend) with the
prefix splits and the causal tail on two streams (`overlap`, the default) against one stream,
side by side: one attention layer of random:qwen3.5-0.8b (H 8, Hkv 2, D 256, bf16) over
shuffled 512-row pages, a 512-id chunk at each context. Also the splits' call and the tail's
call alone (one stream), to show what the overlap can hide.

GPU time only: each round issues its calls behind a GPU sleep long enough for the host to
queue them all, and CUDA events bracket the calls themselves (the gaps between kernels count,
the host's time does not); the variants in turns within a round, medians over rounds. Bits:
both variants' outputs equal, and equal again with the pages elsewhere. Last line: one JSON
object.

    python -m evals.fa4_overlap [--contexts 16384,98304] [--rounds 7] [--calls 20]
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from adapters.model import attn_fa4
from evals.bench import versions

DEV = torch.device("cuda")
H, HKV, D, T, PAGE = 8, 2, 256, 512, 512


def pools(rows: int, seed: int, spare: int = 8):
    """K and V pools [n + spare, PAGE, HKV, D] holding the same `rows` rows for a seed (values
    from `seed`) in pages shuffled by `spare`, among pages of noise: (k, v, pages)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    n = -(-rows // PAGE)
    k_rows, v_rows = (torch.randn(n, PAGE, HKV, D, device=DEV, generator=g).bfloat16()
                      for _ in "kv")
    pages = torch.randperm(n + spare, generator=torch.Generator().manual_seed(spare))[:n]
    out = []
    for x in (k_rows, v_rows):
        pool = torch.randn(n + spare, PAGE, HKV, D, device=DEV).bfloat16()
        pool[pages.to(DEV)] = x
        out.append(pool)
    return out[0], out[1], pages.tolist()


def gpu_ms(fn, calls: int) -> float:
    """GPU ms a call of `calls` issued behind a sleep (the host ahead of the GPU throughout)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e6 * calls))          # ~1 ms a call at ~2 GHz: longer than the host
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / calls


def measure(ctx: int, rounds: int, calls: int) -> dict:
    """A 512-id chunk at context `ctx` (ids): GPU ms a call of each variant (medians of
    `rounds` rounds of `calls` calls, every round's kept under "rounds"), the splits (S, Ls),
    and whether the two streams' output equals one stream's and the same rows placed
    elsewhere give it again."""
    pos = ctx - T
    k, v, pages = pools(ctx, ctx)
    q = torch.randn(T, H, D, device=DEV, generator=torch.Generator(device=DEV).manual_seed(1)
                    ).bfloat16()
    on, off = attn_fa4.FA4Attention(H, HKV), attn_fa4.FA4Attention(H, HKV, overlap=False)
    plan = on.plan(pos, T, pages, PAGE, DEV)
    outs = {name: torch.empty(T, H * D, device=DEV, dtype=torch.bfloat16) for name in "ab"}
    s = plan.splits[0]
    o_part = torch.empty(s + 1, T, H, D, device=DEV, dtype=torch.bfloat16)
    l_part = torch.empty(s + 1, H, T, device=DEV, dtype=torch.float32)
    qs = q[None].expand(max(s, 1), T, H, D).contiguous()
    ks, vs = (x.view(-1, attn_fa4.SUB_PAGE, HKV, D) for x in (k, v))   # as attend reads them
    variants = {
        "overlap": lambda: on.attend(q, pos, k, v, plan, outs["a"]),
        "one_stream": lambda: off.attend(q, pos, k, v, plan, outs["b"]),
        "splits_alone": lambda: off._fwd(qs, ks, vs, plan.split, False, o_part[:s], l_part[:s]),
        "tail_alone": lambda: off._fwd(q[None], ks, vs, plan.tail, True, o_part[s:],
                                       l_part[s:]),
    }
    if not s:
        variants.pop("splits_alone")
    for fn in variants.values():                 # compile, record the direct calls
        fn()
        fn()
    torch.cuda.synchronize()
    same = torch.equal(outs["a"], outs["b"])
    k2, v2, pages2 = pools(ctx, ctx, spare=3)
    moved = torch.empty_like(outs["a"])
    on.attend(q, pos, k2, v2, on.plan(pos, T, pages2, PAGE, DEV), moved)
    runs: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        order = list(variants) if r % 2 == 0 else list(variants)[::-1]
        for name in order:
            runs[name].append(round(gpu_ms(variants[name], calls), 4))
    res = {name: round(statistics.median(x), 4) for name, x in runs.items()}
    res.update(splits=plan.splits, same_bits=same,
               same_bits_other_pages=torch.equal(moved, outs["a"]),
               overlap_over_one_stream=round(res["overlap"] / res["one_stream"], 4),
               rounds=runs)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="16384,98304")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20)
    a = ap.parse_args(argv)
    if not attn_fa4.available(DEV, torch.bfloat16):
        raise SystemExit("FA4 does not run here (a Hopper GPU and flash-attn-4 are needed)")
    out = {}
    for ctx in (int(x) for x in a.contexts.split(",")):
        out[f"{ctx // 1024}k"] = r = measure(ctx, a.rounds, a.calls)
        print(f"{ctx}: " + ", ".join(f"{k} {v}" for k, v in r.items() if k != "rounds"),
              flush=True)
    print(json.dumps({"probe": "fa4_overlap", "dtype": "bfloat16", **versions(),
                      "rounds": a.rounds, "calls": a.calls, "results": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
