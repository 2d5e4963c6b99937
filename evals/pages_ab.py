"""An interleaved A/B of two trees of the code in one run (issue 16's speed targets: pages
against the contiguous buffers of an earlier commit): one worker process per tree, each with
its own model and reader on the same ids, driven in turns by this process, so both see the
same GPU state and drift (one run of each after the other moved the earlier tree's own
figures by up to 16 %). Per point, chunks are read alternately (one chunk A, one chunk B, at
the same contexts), then the 9-class question and decode, alternately; GPU ms by CUDA events
(wall ms on the CPU) in each worker; exactness checked in both at the end.

    python -m evals.pages_ab --a .old2 --b . --ids X.npz Y.npz --points 16384,98304 \\
        --ask-at 32768,100352 [--model random:qwen3.5-0.8b] [--device cuda]

Only the public Reader API is used (feed, read, ask, generate, committed, check_exact), which
both trees have. Prints a line per measurement and, last, one JSON object.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

QUESTION = ("Which kind of turn is this?", ["chat", "code_edit", "debug", "design_ui", "explain",
                                            "plan", "refactor", "review", "test"])


# -- the worker (runs inside one tree) ------------------------------------------------------------
def _timer(device: str):
    import time

    import torch
    if device == "cuda":
        def run(fn):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            return a.elapsed_time(b)
        return run

    def wall(fn):
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return wall


def _kernel_profile():
    """evals/kernel_profile.py of this file's tree (the worker's `evals` package is its own
    tree's, which may not have it)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "kernel_profile", Path(__file__).resolve().with_name("kernel_profile.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _host_chunk(reader, n: int) -> dict:
    """Host time of n one-chunk reads: to the first CUDA graph replay (the GPU idles until
    then: it counts in a chunk's time), and in all; then a cProfile of n more reads, the 20
    functions of largest cumulative time (ms a read)."""
    import cProfile
    import pstats
    import time

    import torch
    first, lead, total = [], [], []
    replay = torch.cuda.CUDAGraph.replay

    def noted(graph):
        first.append(time.perf_counter())
        return replay(graph)
    torch.cuda.CUDAGraph.replay = noted
    try:
        for _ in range(n):
            first.clear()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            reader.read("s", max_chunks=1)
            total.append((time.perf_counter() - t0) * 1e3)
            lead.append((first[0] - t0) * 1e3 if first else -1.0)
            torch.cuda.synchronize()
    finally:
        torch.cuda.CUDAGraph.replay = replay
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        reader.read("s", max_chunks=1)
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats
    rows = sorted(((v[3] * 1e3 / n, f"{k[0].split('/')[-2:]}:{k[2]}") for k, v in stats.items()),
                  reverse=True)[:20]
    return {"lead_ms": statistics.median(lead), "host_ms": statistics.median(total),
            "cumulative_ms": [(round(ms, 3), name) for ms, name in rows]}


def worker(model_name: str, device: str, grid: int) -> None:
    """Commands on stdin, one JSON object a line; one JSON answer a line on stdout."""
    from shadow_plugin import Reader, load_model
    reader = Reader(load_model(model_name, device=device), grid=grid)
    timed, ids, out = _timer(device), [], sys.stdout
    sys.stdout = sys.stderr                      # library prints stay off the answer channel
    for line in sys.stdin:
        cmd = json.loads(line)
        op, ans = cmd["op"], {}
        if op == "ids":
            ids = cmd["ids"]
            reader.warm_up()
            warm = [(ids[0] + 7) % 240000] + ids[1:2 * grid]      # other keys: nothing shared
            reader.feed("warm", warm, "prompt")
            reader.read("warm")
            reader.drop("warm")
            reader.feed("s", ids, "prompt")
        elif op == "read_to":
            while reader.committed("s") < cmd["at"]:
                reader.read("s", max_chunks=1)
        elif op == "chunk":
            ans = {"at": reader.committed("s"),
                   "ms": timed(lambda: reader.read("s", max_chunks=1))}
        elif op == "ask":
            ans = {"ms": timed(lambda: reader.ask("s", QUESTION[0], QUESTION[1], at=cmd["at"]))}
        elif op == "decode":
            gen = reader.generate("s", [11, 12, 13], max_new_tokens=cmd["n"], stop_ids=())
            ans = {"ms_per_token": gen.ms_per_token}
        elif op in ("profile_chunk", "host_chunk") and \
                len(ids) - reader.committed("s") < (2 * cmd["n"] + 1) * grid:
            ans = {"error": f"{len(ids) - reader.committed('s')} ids left to read: fewer than "
                            f"{op} needs (raise --max-context)"}
        elif op == "profile_chunk":
            kernel_table = _kernel_profile().kernel_table
            ans = kernel_table(lambda: reader.read("s", max_chunks=1), calls=cmd["n"])
        elif op == "profile_decode":
            kernel_table = _kernel_profile().kernel_table
            ans = kernel_table(lambda: reader.generate("s", [11, 12, 13], max_new_tokens=cmd["n"],
                                                       stop_ids=()), calls=1)
        elif op == "host_chunk":
            ans = _host_chunk(reader, cmd["n"])
        elif op == "exact":
            ans = {"exact": bool(reader.check_exact("s")), "path": reader.path}
        print(json.dumps(ans), file=out, flush=True)


# -- the driver -----------------------------------------------------------------------------------
class Tree:
    """A worker process in `root` (its code first on the path)."""

    def __init__(self, root: Path, args):
        env = {**os.environ, "PYTHONPATH": f"{root}:{os.environ.get('PYTHONPATH', '')}"}
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", "--model", args.model,
             "--device", args.device, "--grid", str(args.grid)],
            cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __call__(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker stopped on {cmd['op']} (its stderr says why)")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _alternate(a: Tree, b: Tree, rounds: int, field: str,
               **cmd) -> tuple[list[float], list[float]]:
    """`rounds` of the same command, A then B, then B then A (so neither is always first):
    the answers' `field`."""
    ta, tb = [], []
    for i in range(rounds):
        for tree in ((a, b) if i % 2 == 0 else (b, a)):
            (ta if tree is a else tb).append(tree(**cmd)[field])
    return ta, tb


def drive(args) -> dict:
    import numpy as np
    ids = np.concatenate([np.load(p)["ids"] for p in args.ids]).tolist()[:args.max_context]
    a, b = Tree(Path(args.a).resolve(), args), Tree(Path(args.b).resolve(), args)
    res = {}
    try:
        for tree in (a, b):
            tree(op="ids", ids=ids)
        for point in args.points:
            for tree in (a, b):
                tree(op="read_to", at=point)
            ta, tb = [], []
            for i in range(args.chunks):                # chunk i of A, then of B, same context
                ta.append(a(op="chunk")["ms"])
                tb.append(b(op="chunk")["ms"])
            # the first chunk of each is a warm-up (the contiguous tree grows its buffers
            # there): kept in a_all / b_all, left out of the medians
            res[f"chunk_{point // 1024}k"] = _summary(ta, tb, skip=1)
            print(f"chunk at {point}: {res[f'chunk_{point // 1024}k']}", flush=True)
            if args.profile:
                _profile(a, b, res, f"profile_chunk_{point // 1024}k", op="profile_chunk", n=2)
                for name, tree in (("a", a), ("b", b)):
                    res[f"host_{point // 1024}k_{name}"] = h = tree(op="host_chunk", n=4)
                    if "error" in h:
                        print(f"host, chunk at {point}, {name}: {h['error']}", flush=True)
                        continue
                    print(f"host, chunk at {point}, {name}: lead {h['lead_ms']:.3f} ms, all "
                          f"{h['host_ms']:.3f} ms\n" + "\n".join(
                              f"  {ms:8.3f}  {fn}" for ms, fn in h["cumulative_ms"]), flush=True)
        for at in args.ask_at:
            for tree in (a, b):
                tree(op="read_to", at=at // args.grid * args.grid)
                tree(op="ask", at=at)                    # untimed: compiles, tokenizer
            res[f"ask_{at // 1024}k"] = _summary(*_alternate(a, b, args.repeats, "ms",
                                                              op="ask", at=at))
            print(f"ask at {at}: {res[f'ask_{at // 1024}k']}", flush=True)
        for tree in (a, b):
            tree(op="decode", n=2)                       # untimed
        res["decode"] = _summary(*_alternate(a, b, args.repeats, "ms_per_token", op="decode",
                                             n=args.decode))
        print(f"decode: {res['decode']}", flush=True)
        if args.profile:
            _profile(a, b, res, "profile_decode", op="profile_decode", n=args.decode)
        res["exact"] = {"a": a(op="exact"), "b": b(op="exact")}
        print(f"exact: {res['exact']}", flush=True)
    finally:
        a.close()
        b.close()
    return res


def _profile(a: Tree, b: Tree, res: dict, key: str, **cmd) -> None:
    """Kernel by kernel, A beside B (evals/kernel_profile.py), printed and kept in res."""
    from evals.kernel_profile import side_by_side
    pa, pb = a(**cmd), b(**cmd)
    res[key] = {"a": pa, "b": pb}
    if "error" in pa or "error" in pb:
        print(f"{key}: not profiled: {pa.get('error') or pb.get('error')}", flush=True)
        return
    print(f"{key} (per call):\n{side_by_side(pa, pb)}", flush=True)


def _summary(ta: list[float], tb: list[float], skip: int = 0) -> dict:
    """Medians of each side (after its first `skip` values) and their ratio, with every value."""
    ma, mb = statistics.median(ta[skip:]), statistics.median(tb[skip:])
    return {"a_ms": round(ma, 3), "b_ms": round(mb, 3), "b_over_a": round(mb / ma, 4),
            "warm_up_left_out": skip,
            "a_all": [round(x, 3) for x in ta], "b_all": [round(x, 3) for x in tb]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--a", help="tree A (e.g. the earlier commit's `git archive`)")
    ap.add_argument("--b", default=".", help="tree B (default: this one)")
    ap.add_argument("--ids", nargs="+", help=".npz files of evals/session_ids.py")
    ap.add_argument("--model", default="random:qwen3.5-0.8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--grid", type=int, default=512)
    ap.add_argument("--max-context", type=int, default=102400)
    ap.add_argument("--points", type=lambda s: [int(x) for x in s.split(",")],
                    default=[16384, 98304])
    ap.add_argument("--ask-at", type=lambda s: [int(x) for x in s.split(",") if x],
                    default=[32768, 100352])
    ap.add_argument("--chunks", type=int, default=6, help="chunks timed a point, each tree")
    ap.add_argument("--repeats", type=int, default=6, help="asks and decodes, each tree")
    ap.add_argument("--profile", action="store_true",
                    help="also profile a chunk at each point and a decode, kernel by kernel")
    ap.add_argument("--decode", type=int, default=32, help="tokens a decode")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.model, args.device, args.grid)
        return 0
    if not args.a or not args.ids:
        ap.error("--a and --ids are needed")
    res = drive(args)
    print(json.dumps({"probe": "pages_ab", "a": args.a, "b": args.b, "model": args.model,
                      "device": args.device, "grid": args.grid,
                      "date": datetime.date.today().isoformat(), "results": res}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
