"""How long the events thread's hold takes to apply a turn's prompt inside vLLM.

Inside vLLM a new request's prompt is applied by the shadow's events thread under the
turnstile (`Follower.apply`: the ids checked, compared with the held ids, the session's
checkpoints looked up), and a host step that starts meanwhile waits for that hold
(docs/vllm.md). This times it on the model's host side only (no forward: the shadow is kept
busy, so nothing is read): for each prompt length, a new session's first prompt, then its
next turn (the same prompt with an output and a new message after it), medians of --repeats
sessions.

    python -m evals.apply_bench [--model random:tiny] [--lengths 10000,50000,100000]
        [--repeats 5] [--grid 512]

The last line printed is one JSON object (with the machine, versions, commit and date). Its
figures go in BENCHMARKS.md; nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from evals.run_info import git_commit
from shadow_plugin.engine.embedded import EmbeddedShadow
from shadow_plugin.engine.follow import FINISH, OUTPUT, START, Follower, RequestEvent
from shadow_plugin.scheduling.scheduler import SchedulerConfig
from shadow_plugin.server.config import ServiceConfig


def apply_ms(follower: Follower, events: list[RequestEvent]) -> float:
    """One Follower.apply of `events`, ms (perf_counter)."""
    t0 = time.perf_counter()
    follower.apply(events)
    return (time.perf_counter() - t0) * 1e3


def one_length(follower: Follower, num_ids: int, repeats: int, seed: int) -> dict:
    """Medians over `repeats` sessions of num_ids ids: the first prompt's apply, and the next
    turn's (200 output ids and a 300-id message appended), ms."""
    first, nxt = [], []
    for r in range(repeats):
        rng = random.Random(seed + r)
        ids = [rng.randrange(1000) for _ in range(num_ids)]
        out = [rng.randrange(1000) for _ in range(200)]
        req = f"{num_ids}-{r}"
        first.append(apply_ms(follower, [RequestEvent(START, req + "a", tuple(ids))]))
        follower.apply([RequestEvent(OUTPUT, req + "a", tuple(out)),
                        RequestEvent(FINISH, req + "a")])
        prompt = ids + out + [rng.randrange(1000) for _ in range(300)]
        nxt.append(apply_ms(follower, [RequestEvent(START, req + "b", tuple(prompt))]))
        follower.apply([RequestEvent(FINISH, req + "b")])
    return {"first_prompt_ms": round(statistics.median(first), 2),
            "next_turn_ms": round(statistics.median(nxt), 2)}


def run(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ServiceConfig(model=args.model, device="cpu", grid=args.grid,
                            state_dir=Path(tmp) / "state",
                            scheduler=SchedulerConfig(grid=args.grid, poll_s=10.0, share=0.0))
        emb = EmbeddedShadow(cfg)
        emb.start()
        if emb.service.wait_loaded(300) != "ready":
            raise RuntimeError(f"the shadow did not load: {emb.service.error}")
        emb.service.busy = True           # the idle loop reads nothing meanwhile
        try:
            follower = Follower(emb.service.shadow, args.grid)
            one_length(follower, 1000, 1, seed=999)          # warm-up
            by_length = {str(n): one_length(follower, n, args.repeats, seed=n)
                         for n in args.lengths}
        finally:
            emb.close()
    return {"model": args.model, "grid": args.grid, "repeats": args.repeats,
            "apply": by_length, "commit": git_commit(),
            "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
            "python": platform.python_version(), "date": str(datetime.date.today())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:tiny")
    ap.add_argument("--grid", type=int, default=512)
    ap.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",") if x],
                    default=[10_000, 50_000, 100_000])
    ap.add_argument("--repeats", type=int, default=5)
    res = run(ap.parse_args(argv))
    for n, r in res["apply"].items():
        print(f"{n} ids: first prompt {r['first_prompt_ms']} ms, next turn "
              f"{r['next_turn_ms']} ms")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
