"""A/B of the KV allocation for the question latency (issue 5): per session one block viewed as
every layer's k and v (block_store.layout.alloc_kv, one allocation) against two buffers a layer
(the layout before), the 9-class question at 8k, 32k and 100k as bench.ask_latency measures it,
the two layouts alternating in one process (a fresh Reader each turn). Prints a line per turn and,
last, one JSON object.

    python -m evals.ask_ab --ids .devdata/claudecode_vsla_5f8cbb78.npz \
        .devdata/claudecode_vsla_9034225e_seg2.npz
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from adapters.model import load_model
from block_store import files, layout, session
from evals.bench import ask_latency, load_ids, versions
from shadow_plugin.reader import Reader

BLOCK = layout.alloc_kv


def per_layer(spec, rows: int):
    """Two buffers an attention layer, each its own allocation (the layout before)."""
    shape = (rows, *spec.kv_row_shape)
    return [(torch.empty(shape, device=spec.device, dtype=spec.dtype),
             torch.empty(shape, device=spec.device, dtype=spec.dtype))
            for _ in range(spec.num_attention)]


def use(alloc) -> None:
    for module in (session, files):      # the modules that allocate KV buffers
        module.alloc_kv = alloc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ids", nargs="+", required=True)
    p.add_argument("--model", default="random:qwen3.5-0.8b")
    p.add_argument("--at", default="8192,32768,102400")
    p.add_argument("--turns", type=int, default=2)
    a = p.parse_args()
    points = [int(x) for x in a.at.split(",")]
    ids = load_ids(a.ids, max(points) + 1024)
    model = load_model(a.model, device="cuda" if torch.cuda.is_available() else "cpu")
    res = {"block": {p: [] for p in points}, "per_layer": {p: [] for p in points}}
    for turn in range(a.turns):
        for name, alloc in (("block", BLOCK), ("per_layer", per_layer)):
            use(alloc)
            reader = Reader(model, grid=512)
            for at in points:
                res[name][at].append(ask_latency(reader, ids, at))
            print(turn, name, {at: round(v[-1], 2) for at, v in res[name].items()}, flush=True)
            del reader
    use(BLOCK)
    print(json.dumps({"ask_ms_median": {n: {str(at): round(statistics.median(v), 2)
                                           for at, v in r.items()} for n, r in res.items()},
                      "turns": a.turns, **versions()}))


if __name__ == "__main__":
    main()
