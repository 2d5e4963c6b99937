"""Batched forwards against one at a time, in process (issue 36):

- `ask`: several letter-choice questions over one session at a long context (the router
  question and other classifications, at the end of the session: its `tail` ids past the
  context's grid line plus each question) asked in one forward (Reader.ask_many) against the
  same questions asked one at a time (Reader.ask) and against one question alone; every
  batched answer is checked equal to its question asked alone, bit for bit ("exact"); the
  question batches one ask ran (`question_batches_an_ask`, the graph adapter's); with
  --profile the host's time in ask_many by function (cProfile); with --trace one question's
  ask and ask_many under torch.profiler (evals.timing.device_timeline: the device's busy and
  idle time a call, its top kernels, its idle time by our function and by op).
- `read`: one grid chunk of each of B sessions read in one forward (Reader.read_batch)
  against the same chunks read one at a time (Reader.read), at a context; the committed states
  are checked against a fresh prefill afterwards.

    python -m evals.batch_bench [--model random:tiny] [--device cpu] [--grid 512]
    python -m evals.batch_bench --contexts 128 --grid 64 --repeats 2 --batches 1,2   # seconds
        [--contexts 16384,32768] [--read-contexts ...] [--questions 4] [--tail 330]
        [--batches 1,2,4,8] [--repeats 5]
        [--threads 1] [--parts ask,read] [--profile] [--trace]

Figures are medians over `repeats` rounds, the arms taken in turns within a round. The last
line printed is one JSON object (with the machine, versions, commit and date). Its figures go
in BENCHMARKS.md (marked CPU when run on the CPU); nothing here asserts a speed.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys

import torch

from evals.run_info import git_commit
from evals.timing import device_timeline, wall_ms
from shadow_plugin.chat.router import ROUTER
from shadow_plugin.reader.reader import Reader

OTHER_QUESTIONS = (
    ("Is the user asking for code to be written or changed?", ["yes", "no"]),
    ("How did the assistant's last action end?", ["success", "error", "no action yet",
                                                  "unclear"]),
    ("Is the user frustrated?", ["yes", "no", "unsure"]),
    ("Which language is the code mostly in?", ["Python", "TypeScript", "Rust", "Go", "other"]),
)


def questions(n: int) -> list[tuple[str, list[str]]]:
    """n questions: the router question first, then the others in turn."""
    out = [(ROUTER.question, list(ROUTER.choices))]
    while len(out) < n:
        out.append(OTHER_QUESTIONS[(len(out) - 1) % len(OTHER_QUESTIONS)])
    return out[:n]


def session_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 240000) for _ in range(n)]


def ask_part(model, args) -> dict:
    """The `ask` arms at each context (module doc)."""
    out = {}
    items = questions(args.questions)
    for context in args.contexts:
        reader = Reader(model, grid=args.grid)
        # as a server does: the question batches' shapes are checked in the warm-up (a new
        # reader per context: on an H100 about 94 s each)
        before = device_memory_mib(args.device, reader)
        warm_up_s = reader.warm_up()
        warm_up_mib = {k: round(v - before[k], 1) for k, v in
                       device_memory_mib(args.device, reader).items()}
        warm_up_graphs = {k: v for k, v in reader.adapter.graph_stats().items()
                          if k in ("num_runners", "num_graphs", "num_captures",
                                   "num_failed_captures")}
        reader.feed("s", session_ids(context + args.tail, context), "prompt")
        reader.read("s")
        reader.ask("s", *items[0])                       # warm-up (tokenizer, first shapes)
        one, seq, many, exact = [], [], [], True
        each: list[list[float]] = [[] for _ in items]   # each question alone, its own clock
        cuda = args.device == "cuda"
        for _ in range(args.repeats):
            timed = [wall_ms(lambda q=q, c=c: reader.ask("s", q, c), cuda) for q, c in items]
            alone = [a for a, _ in timed]
            for times, (_, ms) in zip(each, timed):
                times.append(ms)
            seq.append(sum(ms for _, ms in timed))
            _, ms = wall_ms(lambda: reader.ask("s", *items[0]), cuda)
            one.append(ms)
            batched, ms = wall_ms(lambda: reader.ask_many("s", items), cuda)
            many.append(ms)
            exact = exact and all(a.probs == b.probs for a, b in zip(alone, batched))
        stats = getattr(reader.adapter, "graph_stats", dict)
        before = stats().get("num_question_batches", 0)
        reader.ask_many("s", items)
        num_batches = stats().get("num_question_batches", 0) - before
        med = {k: statistics.median(v) for k, v in (("one", one), ("seq", seq), ("many", many))}
        out[str(context)] = {
            # the context, and the session's ids read (the context and its --tail)
            "num_ids": context, "committed": reader.committed("s"),
            "num_question_ids": [a.num_forwarded_tokens for a in batched],
            "one_ms": round(med["one"], 2),
            # each question asked alone (the first is `one`'s): what "in one forward over
            # one" reads against, question by question (their rows differ: the router
            # question pads to more rows than the classifications)
            "each_ms": [round(statistics.median(t), 2) for t in each],
            f"{len(items)}_one_at_a_time_ms": round(med["seq"], 2),
            f"{len(items)}_in_one_forward_ms": round(med["many"], 2),
            "batched_over_one": round(med["many"] / med["one"], 3),
            "one_at_a_time_over_one": round(med["seq"] / med["one"], 3),
            "batched": bool(getattr(reader.adapter, "batches", lambda: False)()),
            "question_batches_an_ask": num_batches, "warm_up_s": round(warm_up_s, 1),
            # what the warm-up took on the device (its graphs' pools, FA4's and cuBLAS's
            # workspaces, the KV pool's pages it allocated): MiB, {} on the CPU
            "warm_up_mib": warm_up_mib, "warm_up_graphs": warm_up_graphs,
            # the mixed batches' checks (several buckets in one forward), as the warm-up left
            "mixed_batch_bits": {k: v for k, v in stats().get("question_batch_bits", {}).items()
                                 if "+" in k},
            "exact": exact}
        if args.profile:
            out[str(context)]["profile"] = _host_profile(lambda: reader.ask_many("s", items),
                                                         args.repeats)
        if args.trace:                  # the device's busy and idle time, idle by function
            out[str(context)]["trace"] = {
                "one": device_timeline(lambda: reader.ask("s", *items[0]), args.repeats),
                "many": device_timeline(lambda: reader.ask_many("s", items), args.repeats)}
            print(f"trace {json.dumps(out[str(context)]['trace'])}", file=sys.stderr,
                  flush=True)
        print(f"ask {context}: {out[str(context)]}", file=sys.stderr, flush=True)
    return out


def device_memory_mib(device: str, reader: Reader) -> dict:
    """On CUDA, after a sync: {"reserved": torch's caching allocator's reserved MiB,
    "device_used": the device's used MiB (cudaMemGetInfo: every process and context),
    "kv_pool": the reader's KV pool (KvPool.nbytes) in MiB}; {} elsewhere."""
    if device != "cuda":
        return {}
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {"reserved": torch.cuda.memory_reserved() / 2**20,
            "device_used": (total - free) / 2**20,
            "kv_pool": reader.store.pool.nbytes / 2**20}


def _host_profile(fn, repeats: int, top: int = 25) -> list[list]:
    """`--profile`: fn() run `repeats` times under cProfile: the `top` functions by
    cumulative time, each [file:line(function), calls a run, ms a run] (host time: where an
    ask's milliseconds go besides its forwards)."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(repeats):
        fn()
    prof.disable()
    st = pstats.Stats(prof)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][3])[:top]
    out = [[f"{os.path.basename(f)}:{line}({name})", nc // repeats,
            round(ct * 1e3 / repeats, 3)] for (f, line, name), (_, nc, _, ct, _) in rows]
    print(f"profile {json.dumps(out)}", file=sys.stderr, flush=True)
    return out


def read_part(model, args) -> dict:
    """The `read` arms at each context and batch size (module doc): per round, B sessions
    that each hold `context` ids read plus one chunk, read once one at a time and once in one
    forward (two readers, the same ids)."""
    out = {}
    g = args.grid
    for context in args.read_contexts or args.contexts:
        for b in args.batches:
            readers = [Reader(model, grid=g) for _ in range(2)]
            names = [f"s{i}" for i in range(b)]
            ids = {s: session_ids(context + g * (args.repeats + 1), 100 * i + context)
                   for i, s in enumerate(names)}
            for r in readers:
                for s in names:
                    r.feed(s, ids[s][:context + g], "prompt")
                    r.read(s)
            alone, batched = [], []
            for k in range(args.repeats):
                for r in readers:                      # one more chunk waiting in each
                    for s in names:
                        r.feed(s, ids[s][context + g * (k + 1):context + g * (k + 2)],
                               "output")
                _, ms = wall_ms(lambda: [readers[0].read(s, max_chunks=1) for s in names],
                                args.device == "cuda")
                alone.append(ms)
                res, ms = wall_ms(lambda: readers[1].read_batch(names), args.device == "cuda")
                assert res.num_chunks == b
                batched.append(ms)
            exact = all(r.check_exact(s) for r in readers for s in names)
            a, m = statistics.median(alone), statistics.median(batched)
            row = {"context": context, "sessions": b, "one_at_a_time_ms": round(a, 2),
                   "one_forward_ms": round(m, 2),
                   "ids_per_s_one_at_a_time": round(b * g / a * 1e3),
                   "ids_per_s_one_forward": round(b * g / m * 1e3),
                   "speedup": round(a / m, 3), "exact": exact}
            out[f"{context}x{b}"] = row
            print(f"read {row}", file=sys.stderr, flush=True)
    return out


def run(args) -> dict:
    from adapters import load_model
    torch.set_num_threads(args.threads)
    model = load_model(args.model, device=args.device)
    res = {"model": args.model, "device": args.device, "grid": args.grid,
           "threads": args.threads, "repeats": args.repeats}
    if "ask" in args.parts:
        res["ask"] = ask_part(model, args)
    if "read" in args.parts:
        res["read"] = read_part(model, args)
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else "none"
    return {**res, "gpu": gpu, "dtype": str(model.dtype).removeprefix("torch."),
            "commit": git_commit(), "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "date": str(datetime.date.today())}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:tiny", help="default: %(default)s")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="default: %(default)s")
    ap.add_argument("--grid", type=int, default=512,
                    help="page and chunk size in ids, a multiple of 64 (default: %(default)s)")
    ap.add_argument("--contexts", type=_ints, default=[16384, 32768],
                    help="ids a session holds read before the arms, comma-separated; the ask's "
                    "session also holds --tail more (default: 16384,32768)")
    ap.add_argument("--read-contexts", type=_ints, default=None,
                    help="the read part's contexts (default: --contexts)")
    ap.add_argument("--questions", type=int, default=4,
                    help="questions an ask_many asks, the router question first (default: "
                    "%(default)s)")
    ap.add_argument("--tail", type=int, default=330, help="ids past the context's grid line "
                    "(the ask's tail, forwarded with each question; default: %(default)s)")
    ap.add_argument("--batches", type=_ints, default=[1, 2, 4, 8],
                    help="`read`: sessions B read in one forward (default: 1,2,4,8)")
    ap.add_argument("--repeats", type=int, default=5, help="rounds, medians taken (default: "
                    "%(default)s)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    ap.add_argument("--parts", default="ask,read",
                    help="comma-separated: ask (questions in one forward), read (sessions' "
                    "chunks in one forward); default: %(default)s")
    ap.add_argument("--profile", action="store_true",
                    help="`ask`: ask_many under cProfile too (the top functions by host time)")
    ap.add_argument("--trace", action="store_true",
                    help="`ask`: one question's ask and ask_many under torch.profiler too "
                    "(device busy and idle ms, top kernels, idle time by function)")
    args = ap.parse_args(argv)
    args.parts = args.parts.split(",")
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
