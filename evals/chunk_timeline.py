"""Where a chunk's and a decode step's wall time goes, stage by stage (issue 5): the chunk at a
context past the GPU's own time (the host's staging before the first kernel, the GPU waiting for
the host between graphs, the state copies and the bookkeeping after), and a fork's decode steps
at a long context (each segment graph, each attention, the tail graph).

    python -m evals.chunk_timeline --ids .devdata/claudecode_vsla_5f8cbb78.npz \
        .devdata/claudecode_vsla_9034225e_seg2.npz --contexts 16384,98304 --decode-at 98304

CUDA events are recorded between the stages of the production runners (their graphs, attention
calls, staging and run wrapped in place after capture; ~1 us of GPU an event), so a stage's GPU
time is the time between the event before it and the one after; a stage whose GPU time exceeds
its kernels' is the GPU waiting for the host. Beside each, the host's perf_counter time for the
same stage. Medians over the chunks (or steps) timed. CUDA only. Prints tables and, last, one
JSON object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from adapters.model import load_model
from evals.bench import Timer, load_ids, versions
from shadow_plugin.reader import Reader


class Marks:
    """(stage name, host time s, CUDA event) in the order recorded."""

    def __init__(self):
        self.items: list = []

    def __call__(self, name: str) -> None:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self.items.append((name, time.perf_counter(), ev))

    def take(self) -> list[tuple[str, float, float]]:
        """(name, GPU ms since the previous mark, host ms since it); clears the marks."""
        torch.cuda.synchronize()
        out = [(n, b.elapsed_time(e), (t - s) * 1e3)
               for (_, s, b), (n, t, e) in zip(self.items, self.items[1:])]
        self.items = []
        return out


class _Replay:
    def __init__(self, graph, name: str, marks: Marks):
        self.graph, self.name, self.marks = graph, name, marks

    def replay(self) -> None:
        self.marks(f"{self.name}<")           # the GPU's wait for the host before the graph
        self.graph.replay()
        self.marks(f"{self.name}>")           # the graph's own GPU time


def instrument(runner, marks: Marks) -> None:
    """Wrap a prepared ChunkGraphs' graphs, attention calls, staging and run with marks (with
    FA4 in the graph, its one replay a chunk: the attention runs inside it)."""
    stage, run = runner._stage, runner.run
    if runner.split_graphs is not None:
        replay = runner.split_graphs.replay

        def _split_replay(*a):
            marks("g<")
            replay(*a)
            marks("g>")
        runner.split_graphs.replay = _split_replay
    else:
        runner.graphs = [_Replay(g, f"g{j}", marks) for j, g in enumerate(runner.graphs)]
        attend = runner._attend

        def _attend(j):
            attend(j)
            marks(f"a{j}>")
        runner._attend = _attend

    def _stage(*a):
        stage(*a)
        marks("staged")

    def _run(*a):
        out = run(*a)
        marks("states out")
        return out
    runner._stage, runner.run = _stage, _run


def medians(rows: list[list[tuple[str, float, float]]]) -> list[dict]:
    """Per stage name (first-seen order): median GPU and host ms over the repetitions."""
    names, gpu, host = [], {}, {}
    for row in rows:
        for n, g, h in row:
            if n not in gpu:
                names.append(n)
            gpu.setdefault(n, []).append(g)
            host.setdefault(n, []).append(h)
    return [{"stage": n, "gpu_ms": round(statistics.median(gpu[n]), 4),
             "host_ms": round(statistics.median(host[n]), 4)} for n in names]


def show(title: str, stages: list[dict]) -> None:
    print(f"\n{title}\n{'stage':>12} {'GPU ms':>9} {'host ms':>9}")
    for s in stages:
        print(f"{s['stage']:>12} {s['gpu_ms']:>9.4f} {s['host_ms']:>9.4f}")
    print(f"{'sum':>12} {sum(s['gpu_ms'] for s in stages):>9.4f}")


def chunk_timeline(reader: Reader, marks: Marks, n: int) -> list[dict]:
    rows = []
    for _ in range(n):
        marks("start")
        reader.read("t", max_chunks=1)
        marks("end")
        rows.append(marks.take())
    return medians(rows)


def decode_timeline(reader: Reader, marks: Marks, num_tokens: int) -> tuple[list[dict], float]:
    """Stages of the decode loop's steps (the first step's marks dropped), and ms per token."""
    gen = reader.generate("t", "Summarize the session.", max_new_tokens=num_tokens, stop_ids=(),
                           at=reader.committed("t"))
    items = marks.take()
    steps, row = [], []
    for item in items + [("g0<", 0.0, 0.0)]:
        if item[0] == "g0<" and row:
            steps.append(row)
            row = []
        row.append(item)
    # keep whole decode steps (a tail graph, no chunk runner's marks from the fork's prefill)
    steps = [r for r in steps if r[-1][0] == "tail>" and len(r) == len(steps[-1])]
    return medians(steps[2:]), gen.ms_per_token


def decode_kernels(reader: Reader, num_tokens: int = 17) -> dict:
    """Kernels of the decode loop's steps under the profiler: count and GPU ms per step, top 12."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        reader.generate("t", "Summarize the session.", max_new_tokens=num_tokens, stop_ids=(),
                           at=reader.committed("t"))
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
    ks = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"kernels_per_step": len(ks) / num_tokens,
            "gpu_busy_ms_per_step": round(sum(e.device_time_total for e in ks) / 1e3 / num_tokens, 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ids", nargs="+", required=True)
    p.add_argument("--model", default="random:qwen3.5-0.8b")
    p.add_argument("--contexts", default="16384,98304")
    p.add_argument("--decode-at", type=int, default=98304)
    p.add_argument("--chunks", type=int, default=8)
    a = p.parse_args()
    contexts = sorted(int(x) for x in a.contexts.split(","))
    last = max(contexts + [a.decode_at])
    ids = load_ids(a.ids, last + (a.chunks + 2) * 512)
    reader = Reader(load_model(a.model, device="cuda"), grid=512)
    reader.warm_up()
    reader.feed("s", ids, "prompt")
    timer, marks, res = Timer(torch.device("cuda")), Marks(), {"contexts": {}}
    runners = reader.adapter.runners
    plain = {}
    for ctx in contexts:
        while reader.committed("s") < ctx:
            reader.read("s", max_chunks=1)
        plain[ctx] = [timer(lambda: reader.read("s", max_chunks=1))[1] for _ in range(a.chunks)]
    reader.drop("s")                   # the instrumented chunks: a second session, "t"
    instrument(runners.chunk, marks)
    reader.feed("t", ids, "prompt")
    for ctx in contexts:
        while reader.committed("t") < ctx:
            reader.read("t", max_chunks=1)
            marks.items = []
        stages = chunk_timeline(reader, marks, a.chunks)
        show(f"chunk at {ctx} (plain chunk ms median {statistics.median(plain[ctx]):.3f})", stages)
        res["contexts"][str(ctx)] = {"plain_chunk_ms": round(statistics.median(plain[ctx]), 3),
                                     "stages": stages}
    while reader.committed("t") < a.decode_at:
        reader.read("t", max_chunks=1)
    marks.items = []
    at = reader.committed("t")          # the fork on C itself: no scratch chunks to read first
    reader.generate("t", "Summarize the session.", max_new_tokens=8, stop_ids=(), at=at)  # warm
    plain_tok = statistics.median(reader.generate("t", "Summarize the session.", max_new_tokens=33,
                                                  stop_ids=(), at=at).ms_per_token
                                  for _ in range(3))
    res["decode_kernels"] = decode_kernels(reader)
    instrument(runners.decode(), marks)
    loop = runners.decode_loop()
    loop.graph = _Replay(loop.graph, "tail", marks)
    marks.items = []
    stages, per_tok = decode_timeline(reader, marks, 33)
    show(f"decode step at {a.decode_at} (plain ms per token {plain_tok:.3f}, instrumented "
         f"{per_tok:.3f})", stages)
    res["decode"] = {"at": a.decode_at, "plain_ms_per_token": round(plain_tok, 3),
                     "instrumented_ms_per_token": round(per_tok, 3), "stages": stages}
    print(json.dumps({"model": a.model, **res, **versions()}))


if __name__ == "__main__":
    main()
