"""Single-row projections of a decode step (random:qwen3.5-0.8b's shapes, bf16): cuBLAS through
F.linear against model.gemv's Triton kernel at several tilings, each call timed inside a CUDA
graph of 50 calls (the way the decode runner replays them), on random values; the largest
relative difference to F.linear is printed beside. Prints a table and, last, one JSON object.

    python -m evals.gemv_probe
"""
from __future__ import annotations

import itertools
import json

import torch
import torch.nn.functional as F

from adapters.model import gemv
from evals import attn_kernel
from evals.bench import versions

SHAPES = {"gdn in (fused)": (8224, 1024), "gdn out": (1024, 2048), "mlp gate_up": (7168, 1024),
          "mlp down": (1024, 3584), "attn qkv (fused)": (5120, 1024), "attn o": (1024, 2048)}
TILES = [(bn, bk, 4) for bn, bk in itertools.product((1, 2, 4, 8, 16), (512, 1024))
         if bn * bk <= 8192] + [(4, 256, 4), (8, 256, 4), (8, 512, 8), (16, 512, 8)]


def per_call_us(fn, reps: int = 50) -> float:
    """us a call: attn_kernel.graph_timed over a graph of `reps` calls, median of 5 replays."""
    return attn_kernel.graph_timed(fn, calls=reps, replays=5) * 1e3


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    res = {}
    for name, (n, k) in SHAPES.items():
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
        x = torch.randn(1, k, device="cuda", generator=g).bfloat16()
        ref = F.linear(x.float(), w.float())
        row = {"cublas_us": per_call_us(lambda: F.linear(x, w))}
        best = None
        for tile in TILES:
            us = per_call_us(lambda: gemv.gemv(x, w, tile))
            if best is None or us < best[1]:
                best = (tile, us)
        row["gemv_default_us"] = per_call_us(lambda: gemv.gemv(x, w))
        row["gemv_best_us"], row["gemv_best_tile"] = best[1], best[0]
        err = ((gemv.gemv(x, w).float() - ref).abs().max() / ref.abs().max()).item()
        row["gemv_rel_err"] = err
        row["mb"] = n * k * 2 / 1e6
        res[name] = {a: (round(b, 3) if isinstance(b, float) else b) for a, b in row.items()}
        print(f"{name:>18} {n:>6}x{k:<5} cublas {row['cublas_us']:7.2f} us  gemv "
              f"{row['gemv_default_us']:7.2f} us (best {best[1]:.2f} at {best[0]})  "
              f"{row['mb'] / row['gemv_default_us']:.2f} TB/s  err {err:.1e}", flush=True)
    print(json.dumps({"shapes": res, **versions()}))


if __name__ == "__main__":
    main()
