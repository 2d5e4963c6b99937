"""The reshape's A/B (issue 15): the code before the move (the package `shadow_reader`, from a
checkout of an earlier commit) and after it (`shadow_plugin` over `adapters` and
`block_store`) in one process on the same ids, side by side: chunks read alternately (one
chunk old, one new, CUDA events around each call), each context band read as one backlog
alternately, the 9-class question at 32k and 100k, fork decode at 100k, and a real session
replayed with rewrites and random read budgets (evals.gpu_exact.replay). Checks that the two
committed states are equal bit for bit, that each equals its own fresh prefill, and that the
answers' probabilities and the decoded ids are equal.

    git archive 20c374b shadow_reader bench | tar x -C .old
    python -m evals.move_ab --old .old --ids .devdata/claudecode_vsla_5f8cbb78.npz \
        .devdata/claudecode_vsla_9034225e_seg2.npz

Prints a line per part and, last, one JSON object (GPU, dtype, versions, date, results).
"""
from __future__ import annotations

import argparse
import importlib
import json
import random
import statistics
import sys

import numpy as np
import torch

from evals.bench import BANDS, Timer, band_rates, load_ids, versions
from evals.gpu_exact import CHOICES, QUESTION, replay, turns
from shadow_plugin import Reader, load_model
from shadow_plugin.router import ROUTER


def old_package(path: str):
    """(load_model, Reader) of the code before the move, from a folder holding shadow_reader."""
    sys.path.insert(0, path)
    model = importlib.import_module("shadow_reader.model")
    reader = importlib.import_module("shadow_reader.reader")
    return model.load_model, reader.Reader


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(
            a[k].contiguous().view(torch.uint8), b[k].contiguous().view(torch.uint8)) for k in a)


def chunk_by_chunk(readers: dict, ids: list[int], timer: Timer) -> dict:
    """Read ids from 0 one chunk per call, alternating readers; (context, ms) per reader."""
    out = {name: [] for name in readers}
    for r in readers.values():
        r.feed("bench", ids, "prompt")
    grid = next(iter(readers.values())).config.grid
    while all(r.backlog("bench") >= grid for r in readers.values()):
        for name, r in readers.items():
            c = r.committed("bench")
            out[name].append((c, timer(lambda: r.read("bench", max_chunks=1))[1]))
    return out


def backlog_bands(readers: dict, ids: list[int], timer: Timer) -> dict:
    """ms per 1,000 ids of each band read as one call, alternating readers band by band."""
    grid = next(iter(readers.values())).config.grid
    out = {name: {} for name in readers}
    for r in readers.values():
        r.feed("backlog", ids, "prompt")
    for lo, hi in BANDS:
        n = (min(hi, len(ids)) - lo) // grid
        if n < 1:
            break
        for name, r in readers.items():
            ms = timer(lambda: r.read("backlog", max_chunks=n))[1]
            out[name][f"{lo // 1024}k-{hi // 1024}k"] = round(ms / (n * grid) * 1000, 2)
    for r in readers.values():
        r.drop("backlog")
    return out


def asks(readers: dict, at: int, repeats: int = 5) -> dict:
    """Median ms of the router question with C at `at` and a 330-id tail, alternating readers
    call by call; whether every reader gave the same probabilities."""
    ms = {name: [] for name in readers}
    probs = {}
    for _ in range(repeats + 1):                      # the first round is a warm-up
        for name, r in readers.items():
            a = r.ask("bench", ROUTER.question, list(ROUTER.choices), at=at)
            ms[name].append(a.ms)
            probs[name] = a.probs
    return {"ms": {n: round(statistics.median(v[1:]), 2) for n, v in ms.items()},
            "same_probs": len(set(probs.values())) == 1}


def decode(readers: dict, num_tokens: int = 32) -> dict:
    out, ids = {}, {}
    for name, r in readers.items():
        r.generate("bench", "Summarize the session.", max_new_tokens=4, stop_ids=())
    for name, r in readers.items():
        g = r.generate("bench", "Summarize the session.", max_new_tokens=num_tokens, stop_ids=())
        out[name], ids[name] = round(g.ms_per_token, 3), g.ids
    return {"ms_per_token": out, "same_ids": len(set(ids.values())) == 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="a folder holding the old shadow_reader")
    ap.add_argument("--ids", nargs="+", required=True, help=".npz files of evals/session_ids.py")
    ap.add_argument("--model", default="random:qwen3.5-0.8b")
    ap.add_argument("--max-context", type=int, default=102400)
    ap.add_argument("--grid", type=int, default=512)
    ap.add_argument("--attention", default=None, help="both readers' attention (default theirs)")
    ap.add_argument("--replay-turns", type=int, default=None, help="replay only these turns")
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    old_load, OldReader = old_package(a.old)
    models = {"old": old_load(a.model, device=dev), "new": load_model(a.model, device=dev)}
    opts = {"attention": a.attention} if a.attention else {}
    make = {"old": lambda: OldReader(models["old"], grid=a.grid, **opts),
            "new": lambda: Reader(models["new"], grid=a.grid, **opts)}
    readers = {n: f() for n, f in make.items()}
    res = {"model": a.model, "grid": a.grid, "dtype": str(models["new"].dtype),
           "path": {n: r.path for n, r in readers.items()}, **versions()}
    res["warm_up_s"] = {n: round(r.warm_up(), 1) for n, r in readers.items()}
    print(json.dumps(res), flush=True)
    ids = load_ids(a.ids, a.max_context + 1024)
    timer = Timer(dev)
    chunk_by_chunk(readers, ids[:2 * a.grid], timer)              # warm-up
    for r in readers.values():
        r.drop("bench")
    chunks = chunk_by_chunk(readers, ids[:a.max_context], timer)
    res["ms_per_1k_chunk_by_chunk"] = {n: band_rates(c, a.grid) for n, c in chunks.items()}
    res["chunk_ms_median"] = {n: round(statistics.median(ms for _, ms in c), 3)
                              for n, c in chunks.items()}
    print("chunk by chunk", res["ms_per_1k_chunk_by_chunk"], flush=True)
    states = {n: r.state_tensors("bench") for n, r in readers.items()}
    res["same_bits_after_reads"] = same_bits(states["old"], states["new"])
    del states
    res["exact"] = {n: r.check_exact("bench") for n, r in readers.items()}
    res["ms_per_1k_backlog"] = backlog_bands(readers, ids[:a.max_context], timer)
    print("backlog", res["ms_per_1k_backlog"], flush=True)
    for at in sorted({min(32768, a.max_context), a.max_context}):
        res[f"ask_at_{at // 1024}k"] = asks(readers, at)
    res["decode_at_end"] = decode(readers)
    print("asks and decode", {k: v for k, v in res.items() if k.startswith(("ask", "dec"))},
          flush=True)
    for r in readers.values():
        r.drop("bench")
    data = np.load(a.ids[0])
    plan = turns(data["ids"], data["starts"], data["roles"])[:a.replay_turns]
    replays = {n: make[n]() for n in make}
    stats = {n: replay(r, data["ids"].tolist(), plan, random.Random(0), 7)
             for n, r in replays.items()}
    res["replay"] = {"rollbacks": stats["new"]["rollbacks"],
                     "num_reread": stats["new"]["num_reread"],
                     "same_stats": {k: v for k, v in stats["old"].items() if k != "read_ms"}
                     == {k: v for k, v in stats["new"].items() if k != "read_ms"},
                     "read_ms": {n: round(s["read_ms"], 1) for n, s in stats.items()},
                     "same_bits": same_bits(replays["old"].state_tensors("s"),
                                            replays["new"].state_tensors("s")),
                     "exact": {n: r.check_exact("s") for n, r in replays.items()},
                     "committed": replays["new"].committed("s")}
    below = replays["new"].committed("s") - 300
    res["replay"]["ask_below_c_same"] = len({r.ask("s", QUESTION, CHOICES, at=below).probs
                                             for r in replays.values()}) == 1
    print(json.dumps(res))


if __name__ == "__main__":
    main()
