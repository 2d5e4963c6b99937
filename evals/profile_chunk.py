"""Where one eager 512-id chunk spends its time at a given context (groundwork for issue 5).

    python -m evals.profile_chunk --ids .devdata/claudecode_vsla_5f8cbb78.npz --context 16384

Reads a real session's ids up to --context, then times the next chunks with CUDA events,
profiles two of them with torch.profiler (top kernels by device time, the number of kernel
launches a chunk, the host time a chunk), and times the 9-class question there. Prints the
profile table and, last, one JSON object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from adapters.model import load_model
from shadow_plugin.reader import Reader
from shadow_plugin.router import ROUTER


def chunk_ms(reader: Reader, n: int) -> list[float]:
    """Device time of each of the next n chunks (CUDA events around one read)."""
    out = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        reader.read("s", max_chunks=1)
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
    return out


def decode_profile(reader: Reader, num_steps: int = 16) -> dict:
    """Single-token steps through the decode runner on top of the session (rows above C are
    scratch): wall ms per step with a sync each (as fork decode does), and the GPU's busy ms
    per step from the profiler's kernel times."""
    st = reader.table.resident["s"]
    c, runner = st.committed, reader.adapter.runners.decode()
    tok = torch.tensor([11], dtype=torch.long)

    def steps():
        gdn = st.gdn
        for i in range(num_steps):
            _, gdn = runner.run(tok, c + i, st.kv, gdn)
            torch.cuda.synchronize()
    steps()
    t0 = time.perf_counter()
    steps()
    wall = (time.perf_counter() - t0) * 1e3 / num_steps
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        steps()
    busy = sum(e.device_time_total for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA) / 1e3 / num_steps
    return {"decode_step_wall_ms": round(wall, 3), "decode_step_gpu_busy_ms": round(busy, 3),
            "decode_loop_equals_steps": loop_equals_steps(reader, runner)}


def loop_equals_steps(reader: Reader, runner) -> bool:
    """The decode loop's ids (each token fed back on the device) against runner steps with
    the argmax taken on the host, 24 tokens on top of the session."""
    st = reader.table.resident["s"]
    gen = reader.generate("s", [11, 12, 13], max_new_tokens=24, stop_ids=())
    pos = st.committed
    h, gdn = reader.model(torch.tensor(st.ids[pos:] + [11, 12, 13], device="cuda"), pos,
                          st.kv, st.gdn)
    ids = [int(reader.model.logits(h[-1:])[0].argmax())]
    pos = len(st.ids) + 3
    while len(ids) < 24:
        h, gdn = runner.run(torch.tensor(ids[-1:]), pos, st.kv, gdn)
        ids.append(int(reader.model.logits(h)[0].argmax()))
        pos += 1
    return list(gen.ids) == ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ids", required=True)
    ap.add_argument("--model", default="random:qwen3.5-0.8b")
    ap.add_argument("--context", type=int, default=16384)
    ap.add_argument("--graphs", action="store_true",
                    help="the reader's default runners (CUDA graphs; the profiler traces the "
                         "kernels inside the replays)")
    args = ap.parse_args()
    ids = np.load(args.ids)["ids"].tolist()
    reader = Reader(load_model(args.model, device="cuda"), grid=512, cuda_graphs=args.graphs)
    reader.feed("s", ids[:args.context + 512 * 12], "prompt")
    while reader.committed("s") < args.context:
        reader.read("s", max_chunks=1)
    times = chunk_ms(reader, 6)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        reader.read("s", max_chunks=2)
        torch.cuda.synchronize()
        host_ms = (time.perf_counter() - t0) * 1e3 / 2
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    print(table)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy_ms = sum(e.device_time_total for e in kernels) / 1e3 / 2     # us -> ms, per chunk
    decode = decode_profile(reader) if args.graphs else {}
    reader.feed("s", ids[:reader.committed("s") + 330], "prompt")
    ask = [reader.ask("s", ROUTER.question, list(ROUTER.choices)).ms for _ in range(6)][1:]
    print(json.dumps({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                      "model": args.model, "context": args.context,
                      "chunk_ms": [round(t, 2) for t in times],
                      "chunk_ms_median": round(statistics.median(times), 2),
                      "wall_ms_per_chunk_profiled": round(host_ms, 2),
                      "kernel_launches_per_chunk": len(kernels) // 2,
                      "gpu_busy_ms_per_chunk": round(busy_ms, 3),
                      **decode,
                      "ask_ms_median": round(statistics.median(ask), 2),
                      "graphs": args.graphs,
                      "date": time.strftime("%Y-%m-%d")}))


if __name__ == "__main__":
    main()
