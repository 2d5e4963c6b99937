"""Plot ms per 1,000 ids against context for us (every chunk of a `shadow-reader bench` JSON),
the transformers peer (its 0-32k figure) and the floor (the run's dense-GEMM floor + fla's GDN
layers, 0.88 ms as profiled at 16k unless --gdn-ms + 6 x the attention of one chunk at that
context from a evals/attn_probe.py or evals/fa4_probe.py log, --attn-key naming the variant),
to a PNG.

    python -m evals.plot_read docs/read-bench-2026-11-29-fa4.json docs/fa4-probe-2026-11-29.log \
        docs/read-bench-2026-11-29-fa4.json --attn-key fa4 -o docs/read-vs-context.png
"""
from __future__ import annotations

import argparse
import json

import numpy as np


def last_json(path: str) -> dict:
    return json.loads(open(path).read().strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bench", help="shadow-reader bench JSON (with read_grid512.series)")
    p.add_argument("attn", help="evals/attn_probe.py log (FlashAttention per layer by context)")
    p.add_argument("peer", help="a bench JSON with peer_transformers_ms_per_1k")
    p.add_argument("--gdn-ms", type=float, default=0.88)
    p.add_argument("--attn-key", default="fa_s0",
                   help="the probe's variant: fa_s0 (attn_probe's FlashAttention-2) or fa4")
    p.add_argument("-o", "--out", required=True)
    a = p.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = last_json(a.bench)
    grid = 512
    series = np.array(res["read_grid512"]["series"])            # [chunks, 2] (context, ms)
    ctx, ms = series[:, 0] + grid, series[:, 1] / grid * 1000
    cases = last_json(a.attn)["cases"]
    pts = sorted((int(k.split("_ctx")[1]), v[a.attn_key]["ms"])
                 for k, v in cases.items() if k.startswith("T512_"))
    flash = np.interp(ctx, [c for c, _ in pts], [s for _, s in pts])
    floor = (res["gemm_floor_ms_per_chunk"] + a.gdn_ms + 6 * flash) / grid * 1000
    peer = last_json(a.peer)["peer_transformers_ms_per_1k"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(ctx / 1024, ms, label="shadow-reader (CUDA graphs), per chunk", lw=1)
    name = {"fa_s0": "FlashAttention-2", "fa4": "FlashAttention-4 (split)"}.get(a.attn_key,
                                                                                a.attn_key)
    ax.plot(ctx / 1024, floor, label=f"floor: GEMMs + GDN + 6 x {name}", ls="--")
    ax.hlines(peer, 0, 32, colors="C3", label="transformers + fla (mean 0-32k)")
    ax.set_yscale("log")
    ax.set_xlabel("context (k ids)")
    ax.set_ylabel("ms per 1,000 ids")
    ax.set_title(f"read rate, {res['model']}, {res['dtype']}, grid 512, {res['gpu']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(json.dumps({"out": a.out, "chunks": len(ctx), "peer_ms_per_1k": peer}))


if __name__ == "__main__":
    main()
