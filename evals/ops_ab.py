"""A/B of the fused op sets in one process (issue 5): the chunk runner with the GDN conv and
gates in one compiled function (ops.fused_ops(compile_conv=True)) against the kernel set's
conv (fla's on CUDA) and the compiled gates (the default), on the same model, ids and fused
projections. Each arm
keeps its own session state; chunks alternate between the arms at every context, so machine
drift hits both. CUDA events around each chunk (a sync after each, as the reader's chunk by
chunk reads). Prints a line per context and, last, one JSON object.

    python -m evals.ops_ab --ids .devdata/claudecode_vsla_5f8cbb78.npz --contexts 512,16384,65536
    python -m evals.ops_ab --model random:tiny --device cpu --ids examples/session.json \
        --contexts 128 --chunks 2 --grid 64                   # a CPU smoke run
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

import torch

from adapters import spec_for
from adapters.model import load_model, ops
from adapters.model.fuse import fuse_projections
from adapters.model.graphs import ChunkGraphs
from block_store.layout import alloc_kv, zero_gdn
from evals.bench import Timer, load_ids, versions


class Arm:
    """One op set's chunk runner and its own session state (KV rows for max_rows)."""

    def __init__(self, model, grid: int, op_set, proj, max_rows: int):
        self.runner = ChunkGraphs(model, grid, op_set=op_set, proj=proj, keep_states=True)
        self.kv = alloc_kv(spec_for(model.cfg, model.device, model.dtype), max_rows)
        self.gdn, self.pos = zero_gdn(spec_for(model.cfg, model.device, model.dtype)), 0

    def chunk(self, ids: list[int]) -> None:
        t = self.runner.t
        _, self.gdn = self.runner.run(torch.tensor(ids[self.pos:self.pos + t]), self.pos,
                                      self.kv, self.gdn)
        self.pos += t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ids", nargs="+", required=True)
    p.add_argument("--model", default="random:qwen3.5-0.8b")
    p.add_argument("--device", default=None)
    p.add_argument("--grid", type=int, default=512)
    p.add_argument("--contexts", default="512,16384,65536")
    p.add_argument("--chunks", type=int, default=8, help="timed chunks per arm per context")
    a = p.parse_args()
    contexts = sorted(int(x) for x in a.contexts.split(","))
    rows = contexts[-1] + (a.chunks + 1) * a.grid
    ids = load_ids(a.ids, rows)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = load_model(a.model, device=device)
    compiled = ops.fused_ops(compile_conv=True)
    proj = fuse_projections(model)
    arms = {"conv_gates": Arm(model, a.grid, compiled, proj, rows),
            "kernel_conv": Arm(model, a.grid, dataclasses.replace(compiled, conv_gates=None), proj,
                            rows)}
    timer, res = Timer(device), {}
    for ctx in contexts:
        for arm in arms.values():                      # untimed up to the context
            while arm.pos + a.grid <= ctx:
                arm.chunk(ids)
        times = {name: [] for name in arms}
        for _ in range(a.chunks):                      # alternating, each at the same pos
            for name, arm in arms.items():
                times[name].append(timer(lambda: arm.chunk(ids))[1])
        res[str(ctx)] = {name: round(statistics.median(ms), 3) for name, ms in times.items()}
        print(f"{ctx:>7}  {res[str(ctx)]}", flush=True)
    print(json.dumps({"model": a.model, "grid": a.grid, "chunk_ms_median": res,
                      "chunks_per_arm": a.chunks, **versions()}))


if __name__ == "__main__":
    main()
