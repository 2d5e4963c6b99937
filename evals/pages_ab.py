"""An interleaved A/B of two trees of the code in one run (issue 16's speed targets: pages
against the contiguous buffers of an earlier commit): one worker process per tree, each with
its own model and reader on the same ids, driven in turns by this process, so both see the
same GPU state and drift (one run of each after the other moved the earlier tree's own
figures by up to 16 %). With --bands, first the read rate over id ranges read as a backlog
(one read call each, a session of its own), alternately. Per point, chunks are read
alternately (one chunk A, one chunk B, at the same contexts; with --burst also in bursts of
chunks back to back), then the 9-class
question and decode, alternately; GPU ms by CUDA events (wall ms on the CPU) in each worker;
exactness checked in both at the end. With --pairs N, all of it N times with fresh workers
(the workers' own processes differ: evals/ab_worker.py), and the ratios' medians.

    python -m evals.pages_ab --a .old2 --b . --ids X.npz Y.npz --points 16384,98304 \\
        --ask-at 32768,100352 [--model random:qwen3.5-0.8b] [--device cuda]

Only the public Reader API is used (feed, read, ask, generate, committed, check_exact, drop), which
both trees have. Prints a line per measurement and, last, one JSON object.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

from evals.ab_tree import Tree


def _alternate(a: Tree, b: Tree, rounds: int, field: str,
               **cmd) -> tuple[list[float], list[float]]:
    """`rounds` of the same command, A then B, then B then A (so neither is always first):
    the answers' `field`."""
    ta, tb = [], []
    for i in range(rounds):
        for tree in ((a, b) if i % 2 == 0 else (b, a)):
            (ta if tree is a else tb).append(_answer(tree(**cmd))[field])
    return ta, tb


def drive(args) -> dict:
    """One pair of workers (the results), or with args.pairs > 1 that many fresh pairs, B's
    chunk first in odd pairs: {"pairs": [results], "across_pairs": {measurement: {"b_over_a":
    [a ratio a pair], "median": their median}}}. Two workers of one tree differed by 3 % in
    one run on the H200 (docs/pages-ab-same-tree-2026-12-02.log), so a single pair cannot
    resolve a 3 % target."""
    import numpy as np
    ids = np.concatenate([np.load(p)["ids"] for p in args.ids]).tolist()[:args.max_context]
    if args.pairs == 1:
        return drive_pair(args, ids, swap=False)
    pairs = []
    for i in range(args.pairs):
        print(f"pair {i} ({'B' if i % 2 else 'A'}'s chunk first)", flush=True)
        pairs.append(drive_pair(args, ids, swap=i % 2 == 1))
    across = {}
    for key, ratios in _ratios(pairs).items():
        across[key] = {"b_over_a": ratios, "median": round(statistics.median(ratios), 4)}
        print(f"across pairs, {key}: {across[key]}", flush=True)
    return {"pairs": pairs, "across_pairs": across}


def _ratios(pairs: list[dict]) -> dict[str, list[float]]:
    """Every b_over_a of the pairs' results (nested ones named 'outer/inner'), a list each."""
    out: dict[str, list[float]] = {}
    for res in pairs:
        for key, val in res.items():
            if isinstance(val, dict) and "b_over_a" in val:
                out.setdefault(key, []).append(val["b_over_a"])
            elif isinstance(val, dict):
                for inner, v in val.items():
                    if isinstance(v, dict) and "b_over_a" in v:
                        out.setdefault(f"{key}/{inner}", []).append(v["b_over_a"])
    return out


def drive_pair(args, ids: list[int], swap: bool) -> dict:
    """The measurements of one pair of fresh workers (swap: B's chunk before A's)."""
    a = Tree(Path(args.a).resolve(), args, args.a_bucket_rows)
    b = Tree(Path(args.b).resolve(), args, args.b_bucket_rows)
    res = {}
    try:
        # each tree's reader construction and warm-up (seconds) and the allocator's bytes
        res["setup"] = {name: _answer(tree(op="ids", ids=ids)) for name, tree in (("a", a),
                                                                                  ("b", b))}
        print(f"setup: {res['setup']}", flush=True)
        for start, end in args.bands:
            for tree in (a, b):                           # untimed: the kernels' first calls
                _answer(tree(op="band", start=start, end=min(end, start + 4 * args.grid)))
            key = f"band_{start}_{end}"
            res[key] = _summary(*_alternate(a, b, args.repeats, "ms_per_1k", op="band",
                                            start=start, end=end))
            print(f"read rate over [{start}, {end}), ms per 1,000 ids: {res[key]}", flush=True)
        for point in args.points:
            for tree in (a, b):
                tree(op="read_to", at=point)
            ta, tb = [], []
            for i in range(args.chunks):                # chunk i of A and of B, same context
                for tree in ((b, a) if swap else (a, b)):
                    (ta if tree is a else tb).append(_answer(tree(op="chunk"))["ms"])
            # the first chunk of each is a warm-up (the contiguous tree grows its buffers
            # there): kept in a_all / b_all, left out of the medians
            res[f"chunk_{point // 1024}k"] = _summary(ta, tb, skip=1)
            print(f"chunk at {point}: {res[f'chunk_{point // 1024}k']}", flush=True)
            if args.burst:
                res[f"burst_{point // 1024}k"] = _bursts(a, b, args.burst, args.chunks)
                print(f"bursts at {point}: {res[f'burst_{point // 1024}k']}", flush=True)
            if args.profile:
                _profile(a, b, res, f"profile_chunk_{point // 1024}k", op="profile_chunk", n=2)
                for name, tree in (("a", a), ("b", b)):
                    res[f"host_{point // 1024}k_{name}"] = h = tree(op="host_chunk", n=4)
                    _print_host(f"chunk at {point}, {name}", h)
        for at in args.ask_at:
            for tree in (a, b):
                tree(op="read_to", at=at // args.grid * args.grid)
                tree(op="ask", at=at)                    # untimed: compiles, tokenizer
            res[f"ask_{at // 1024}k"] = _summary(*_alternate(a, b, args.repeats, "ms",
                                                              op="ask", at=at))
            print(f"ask at {at}: {res[f'ask_{at // 1024}k']}", flush=True)
            if args.profile:                             # after the timings: no timing follows
                _profile(a, b, res, f"profile_ask_{at // 1024}k", op="profile_ask", at=at, n=3)
                for name, tree in (("a", a), ("b", b)):
                    res[f"host_ask_{at // 1024}k_{name}"] = h = tree(op="host_ask", at=at, n=4)
                    _print_host(f"ask at {at}, {name}", h)
        for tree in (a, b):
            tree(op="decode", n=2)                       # untimed
        res["decode"] = _summary(*_alternate(a, b, args.repeats, "ms_per_token", op="decode",
                                             n=args.decode))
        print(f"decode: {res['decode']}", flush=True)
        if args.profile:
            _profile(a, b, res, "profile_decode", op="profile_decode", n=args.decode)
        for start, end in args.bands if args.profile else ():
            # last: the profiler can slow the kernels launched after it (CUPTI stays
            # attached), so no timing follows these
            _profile(a, b, res, f"profile_band_{start}_{end}", op="profile_band", start=start,
                     end=end, n=8)
        res["exact"] = {"a": a(op="exact"), "b": b(op="exact")}
        print(f"exact: {res['exact']}", flush=True)
    finally:
        a.close()
        b.close()
    return res


def _bursts(a: Tree, b: Tree, n: int, rounds: int) -> dict:
    """`rounds` bursts of n chunks back to back in each tree, A's and B's in turns (B first in
    odd rounds). A tree's worker waits between its turns, so the first chunk of a burst starts
    on a cold host, as every chunk of the strict alternation does; the others follow a chunk
    of the same process, as in a backlog or a turn of several chunks. Medians of each."""
    runs = {"a": [], "b": []}
    for i in range(rounds):
        for name, tree in (("a", a), ("b", b)) if i % 2 == 0 else (("b", b), ("a", a)):
            runs[name].append(_answer(tree(op="chunks", n=n))["ms"])
    first = _summary([r[0] for r in runs["a"]], [r[0] for r in runs["b"]], skip=1)
    rest = _summary([x for r in runs["a"] for x in r[1:]], [x for r in runs["b"] for x in r[1:]],
                    skip=n - 1)
    return {"first_of_burst": first, "rest_of_burst": rest, "burst": n}


def _answer(ans: dict) -> dict:
    """A worker's answer; RuntimeError with its reason when it is an error."""
    if "error" in ans:
        raise RuntimeError(ans["error"])
    return ans


def _profile(a: Tree, b: Tree, res: dict, key: str, **cmd) -> None:
    """Kernel by kernel, A beside B (evals/kernel_profile.py), printed and kept in res."""
    from evals.kernel_profile import side_by_side
    pa, pb = a(**cmd), b(**cmd)
    res[key] = {"a": pa, "b": pb}
    if "error" in pa or "error" in pb:
        print(f"{key}: not profiled: {pa.get('error') or pb.get('error')}", flush=True)
        return
    print(f"{key} (per call):\n{side_by_side(pa, pb)}", flush=True)


def _print_host(what: str, h: dict) -> None:
    """A worker's _host_calls answer (or its error) as text lines."""
    if "error" in h:
        print(f"host, {what}: {h['error']}", flush=True)
        return
    print(f"host, {what}: lead {h['lead_ms']:.3f} ms, all {h['host_ms']:.3f} ms\n" + "\n".join(
        f"  {ms:8.3f}  {fn}" for ms, fn in h["cumulative_ms"]), flush=True)


def _summary(ta: list[float], tb: list[float], skip: int = 0) -> dict:
    """Medians of each side (after its first `skip` values) and their ratio, with every value."""
    ma, mb = statistics.median(ta[skip:]), statistics.median(tb[skip:])
    return {"a_ms": round(ma, 3), "b_ms": round(mb, 3), "b_over_a": round(mb / ma, 4),
            "warm_up_left_out": skip,
            "a_all": [round(x, 3) for x in ta], "b_all": [round(x, 3) for x in tb]}


def _bands(text: str) -> list[tuple[int, int]]:
    """'0:32768,65536:102400' -> [(0, 32768), (65536, 102400)]."""
    try:
        bands = [tuple(int(x) for x in part.split(":")) for part in text.split(",") if part]
    except ValueError:
        bands = [()]
    if any(len(b) != 2 for b in bands):
        raise argparse.ArgumentTypeError(f"bands {text!r}: expected START:END,...")
    return bands


def _bucket_rows(text: str) -> str:
    """'64,128' back if Runners would take it as small question bucket rows
    (adapters.model.runners.check_small_bucket_rows), 'none' (no small buckets) and '' (the
    tree's own) as they are, else argparse's error with its reason."""
    if text in ("", "none"):
        return text
    try:
        rows = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"row counts separated by commas, got {text!r}")
    from adapters.model.runners import Runners, check_small_bucket_rows
    try:
        check_small_bucket_rows(rows, Runners.BUCKET)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"ascending multiples of 64 below {Runners.BUCKET}, "
                                         f"got {text!r}: {e}")
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", help="tree A (e.g. the earlier commit's `git archive`)")
    ap.add_argument("--b", default=".", help="tree B (default: this one)")
    ap.add_argument("--a-bucket-rows", type=_bucket_rows, default="",
                    help="tree A's small question buckets in rows, e.g. 64,128, or none (a "
                         "tree whose Runners take small_bucket_rows; default: the tree's own)")
    ap.add_argument("--b-bucket-rows", type=_bucket_rows, default="",
                    help="the same for tree B")
    ap.add_argument("--ids", nargs="+", help=".npz files of evals/session_ids.py")
    ap.add_argument("--model", default="random:qwen3.5-0.8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--grid", type=int, default=512)
    ap.add_argument("--max-context", type=int, default=102400)
    ap.add_argument("--points", type=lambda s: [int(x) for x in s.split(",") if x],
                    default=[16384, 98304], help="contexts a chunk is timed at ('' for none)")
    ap.add_argument("--ask-at", type=lambda s: [int(x) for x in s.split(",") if x],
                    default=[32768, 100352])
    ap.add_argument("--bands", type=_bands, default=[],
                    help="read rates over these id ranges read as a backlog, each in a "
                         "session of its own, e.g. 0:32768,65536:102400")
    ap.add_argument("--chunks", type=int, default=6, help="chunks timed a point, each tree")
    ap.add_argument("--burst", type=int, default=0,
                    help="also time --chunks bursts of this many chunks back to back a tree")
    ap.add_argument("--repeats", type=int, default=6,
                    help="bands, asks and decodes, each tree")
    ap.add_argument("--profile", action="store_true",
                    help="also profile, kernel by kernel, a chunk at each point (the timings "
                         "after it follow a profile), a decode, and last each band's chunks "
                         "8-15 read as one backlog (after chunks 0-7 untraced)")
    ap.add_argument("--decode", type=int, default=32, help="tokens a decode")
    ap.add_argument("--pairs", type=int, default=1,
                    help="fresh pairs of workers, each measuring everything (B first in odd "
                         "pairs); the ratios' medians across pairs")
    args = ap.parse_args(argv)
    if not args.a or not args.ids:
        ap.error("--a and --ids are needed")
    if args.pairs < 1 or args.chunks < 2 or args.burst == 1 or args.burst < 0:
        ap.error(f"--pairs >= 1, --chunks >= 2 (the first is a warm-up) and --burst 0 or >= 2 "
                 f"needed, got {args.pairs}, {args.chunks}, {args.burst}")
    bad = [f"{a}:{b}" for a, b in args.bands if a % args.grid or b % args.grid or not
           0 <= a < b <= args.max_context]
    if bad:
        ap.error(f"bands {', '.join(bad)}: whole chunks of {args.grid} within --max-context "
                 f"({args.max_context}) needed")
    need = max(args.points, default=0) + args.grid * args.chunks * (1 + args.burst)
    if args.points and need > args.max_context:
        ap.error(f"the chunks timed at {max(args.points)} read to {need} ids: raise "
                 f"--max-context ({args.max_context}) or lower --chunks or --burst")
    res = drive(args)
    print(json.dumps({"probe": "pages_ab", "a": args.a, "b": args.b,
                      "a_bucket_rows": args.a_bucket_rows,
                      "b_bucket_rows": args.b_bucket_rows,
                      "model": args.model,
                      "device": args.device, "grid": args.grid,
                      "date": datetime.date.today().isoformat(), "results": res}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
