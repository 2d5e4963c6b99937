"""Single-token decode attention over pages (issue 16: decode at 100k was 2.23 ms a token over
pages against 1.76 with FlashAttention-2 on contiguous rows). Shapes of random:qwen3.5-0.8b
(H 8, Hkv 2, D 256), bf16, one query row at 25k, 50k and 100k context: FlashAttention-2
(`attn_flash`) on the rows contiguous, and the table attention (`attn_triton.attend_table`) over
the same rows in shuffled 512-row pages under several tilings, and over pages in order (what
paging itself costs). Median GPU ms of 50 calls (CUDA events, after warm-up); relative RMS
against the fp32 twin; bits equal under two page orders. Last line: one JSON object.

    python -m evals.decode_probe [--only decode,pages_s256,...] [--rounds 1]
        [--contexts 25600,51200,102400]

With --rounds R the calls are timed in turns, each once a round (50 calls, CUDA events), and
each figure is the median of its R rounds (all kept under "rounds").
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

import torch

from adapters.model import attn_flash
from adapters.model import attn_triton as at
from adapters.model.ref import attend_ref
from evals import attn_kernel
from evals.bench import versions

DEV, DT, PAGE = torch.device("cuda"), torch.bfloat16, 512


def _tiling(**kw) -> at.SplitConfig:
    """A decode tiling: DECODE's block_m, min_split and warps unless given."""
    return at.SplitConfig(**{"block_m": 16, "min_split": 512, "num_warps": 4, **kw})


TILINGS = {"decode": at.DECODE,
           "bn64": _tiling(block_n=64, s_max=64),
           "bn64_s128": _tiling(block_n=64, s_max=128),
           "bn128_w8": _tiling(block_n=128, s_max=128, num_warps=8),
           "bn64_st3": _tiling(block_n=64, s_max=128, num_stages=3),
           "bn32_s128": _tiling(block_n=32, s_max=128),
           "bn32_s256": _tiling(block_n=32, s_max=256, min_split=256),
           "bn64_s256": _tiling(block_n=64, s_max=256, min_split=256),
           "bn32_s256_w2": _tiling(block_n=32, s_max=256, min_split=256, num_warps=2),
           "bn32_s512": _tiling(block_n=32, s_max=512, min_split=128),
           # page splits (whole 512-row pages a split, one table load a page): s256 is one
           # page a split at 100k (200 splits), s128 two
           "pages_s256": _tiling(block_n=32, s_max=256, page_splits=True),
           "pages_s128": _tiling(block_n=32, s_max=128, page_splits=True),
           "pages_s256_bn64": _tiling(block_n=64, s_max=256, page_splits=True),
           "pages_s256_w2": _tiling(block_n=32, s_max=256, num_warps=2, page_splits=True),
           "pages_s256_st3": _tiling(block_n=32, s_max=256, num_stages=3, page_splits=True),
           # FlashAttention-2's own decode tiling, near: 64-key blocks, about 57 splits
           "bn64_s64_st3": _tiling(block_n=64, s_max=64, num_stages=3),
           "bn64_s64_w8": _tiling(block_n=64, s_max=64, num_warps=8),
           "bn128_s64_w8": _tiling(block_n=128, s_max=64, num_warps=8),
           "bn32_s64": _tiling(block_n=32, s_max=64),
           "bn64_s32": _tiling(block_n=64, s_max=32),
           # today's DECODE with the splits combined in order (before vector_combine)
           "decode_in_order": _tiling(s_max=128),
           # today's DECODE with each page entry loaded in its own block (before ahead)
           "decode_in_block": dataclasses.replace(at.DECODE, ahead=False)}


def timed(fn) -> float:
    """attn_kernel.timed over 50 calls, rounded (each call's host time before its first kernel
    counts: about 0.05 ms a call here, more than the kernels' differences; see
    attn_kernel.graph_timed)."""
    return round(attn_kernel.timed(fn, repeats=50), 4)


def pools(rows, seed, spare=8):
    g = torch.Generator(device=DEV).manual_seed(seed)
    n = -(-rows // PAGE)
    order = torch.randperm(n + spare, generator=torch.Generator().manual_seed(seed))[:n]
    k = torch.randn(n + spare, PAGE, 2, 256, device=DEV, generator=g).to(DT)
    v = torch.randn(n + spare, PAGE, 2, 256, device=DEV, generator=g).to(DT)
    return k, v, order.to(DEV)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated tilings (default: all)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="timings taken in turns, every call once a round; medians of rounds")
    ap.add_argument("--contexts", default="25600,51200,102400")
    ap.add_argument("--graph", action="store_true",
                    help="time calls captured in a CUDA graph (no host time; "
                         "attn_kernel.graph_timed)")
    args = ap.parse_args(argv)
    only = [x for x in args.only.split(",") if x]
    tilings = {k: v for k, v in TILINGS.items() if not only or k in only}
    if "decode" not in tilings or set(only) - set(TILINGS):
        raise SystemExit(f"--only names tilings of {sorted(TILINGS)} and keeps 'decode'")
    res = {}
    for ctx in (int(x) for x in args.contexts.split(",")):
        pos = ctx - 1
        k, v, order = pools(ctx, 1)
        rows_k = k[order].flatten(0, 1)[:ctx].contiguous()
        rows_v = v[order].flatten(0, 1)[:ctx].contiguous()
        gen = torch.Generator(device=DEV).manual_seed(2)
        q = torch.randn(1, 8, 256, device=DEV, generator=gen).to(DT)
        out = torch.empty(1, 8 * 256, device=DEV, dtype=DT)
        want = attend_ref(q, rows_k, rows_v, pos)
        calls = {"fa2_contiguous": lambda: attn_flash.attend(q, pos, rows_k, rows_v, out)}
        row = {}
        base, ptrs = attn_kernel.pool_args(k, v)
        pos_t = torch.tensor([pos], dtype=torch.long, device=DEV)
        for name, cfg in tilings.items():
            o_part, l_part = at.scratch(1, 8, 256, cfg, DEV)

            def call(pages=order, kp=ptrs, cfg=cfg, o_part=o_part, l_part=l_part):
                at.attend_table(q, base, kp, pos_t, 2, o_part, l_part, out, cfg, pages, PAGE)
            call()
            got = out.clone()
            row[name + "_rel_rms"] = round(attn_kernel.rel_rms(got, want), 5)
            k2, v2, order2 = pools(ctx, 3, spare=3)      # the same rows in other places
            k2[order2], v2[order2] = k[order], v[order]
            ptrs2 = attn_kernel.pool_args(k2, v2, base)[1]
            call(order2, ptrs2)
            row[name + "_same_bits_other_pages"] = torch.equal(out, got)
            del k2, v2
            calls[name] = call
            if name == "decode" and ctx % PAGE == 0:
                ptrs_c = attn_kernel.pool_args(rows_k, rows_v, base)[1]
                in_order = torch.arange(order.numel(), device=DEV)
                calls["decode_pages_in_order"] = lambda c=call, p=in_order, kp=ptrs_c: c(p, kp)
        times = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, fn in calls.items():
                times[name].append(attn_kernel.graph_timed(fn) if args.graph else timed(fn))
        row.update({name: round(statistics.median(t), 4) for name, t in times.items()})
        if args.rounds > 1:
            row["rounds"] = {name: t for name, t in times.items()}
        res[f"{ctx // 1024}k"] = row
        print(ctx, row, flush=True)
    print(json.dumps({"probe": "decode", "dtype": "bfloat16", "graph": args.graph,
                      "gpu": torch.cuda.get_device_name(), **versions(), "rounds": args.rounds,
                      "results": res}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
