"""The service under load (issue 19): a real `serve` subprocess on a loopback port, a set of
sessions read to their end, then rounds of concurrent asks and a round of waiting asks with the
health route timed meanwhile. Per round: the answers' codes, latency percentiles and the
server's RSS; then the RSS growth from the first round to the last.

    python -m evals.load [--model random:tiny] [--device cpu] [--sessions 8] [--ids 4096]
        [--rounds 5] [--concurrent 40] [--waits 200] [--workers 2] [--queue 32] [--gb 0.5]

The last line printed is one JSON object (with the machine, versions and date). Its figures go
in BENCHMARKS.md; nothing here asserts a latency.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
import torch

from evals.serve_proc import free_port, start_service

ASK = {"question": "Is this about code?", "choices": ["yes", "no"]}


def _proc(pid: int) -> dict:
    """The server's RSS (MiB) and threads, from /proc."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return {"rss_mib": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
            "threads": int(fields["Threads"])}


def _held(url: str) -> dict:
    """What the reader holds by its own count (MiB): the page pool, resident bytes, GDN
    entries."""
    s = httpx.get(f"{url}/v1/shadow/status", timeout=60).json()
    return {k: round(s[k] / 2**20, 1) for k in ("pool_bytes", "resident_bytes",
                                                  "gdn_entry_bytes")}


def start(args, tmp: str) -> tuple[subprocess.Popen, str]:
    """The service, ready; raises RuntimeError when it does not start in 300 s."""
    env = {**os.environ, "SHADOW_MODEL": args.model, "SHADOW_DEVICE": args.device,
           "SHADOW_GRID": str(args.grid), "SHADOW_DIR": tmp, "SHADOW_GB": str(args.gb),
           "SHADOW_ASK_WORKERS": str(args.workers), "SHADOW_ASK_QUEUE": str(args.queue)}
    try:
        return start_service(env, free_port(), timeout_s=300, poll_s=0.2)
    except TimeoutError:
        raise RuntimeError("the service did not start") from None


def fill(url: str, args) -> list[str]:
    """args.sessions sessions of args.ids random ids each, ended and read to their last line."""
    rng, names = random.Random(0), [f"load-{i}" for i in range(args.sessions)]
    for s in names:
        ids = [rng.randrange(1000, 240000) for _ in range(args.ids)]
        httpx.post(f"{url}/v1/shadow/sessions/{s}/turn", json={"prompt_ids": ids}, timeout=60)
        httpx.post(f"{url}/v1/shadow/sessions/{s}/end", timeout=60)
    for s in names:
        r = httpx.post(f"{url}/v1/shadow/ask", json={"session": s, **ASK, "wait": True,
                                                     "timeout_s": 600}, timeout=660)
        r.raise_for_status()
    return names


def percentiles(ms: list[float]) -> dict:
    """p50, p90, p99 and max of latencies `ms` (ms, rounded to 0.1); {} for none."""
    if not ms:
        return {}
    q = statistics.quantiles(ms, n=100, method="inclusive") if len(ms) > 1 else ms * 99
    return {"p50_ms": round(q[49], 1), "p90_ms": round(q[89], 1), "p99_ms": round(q[98], 1),
            "max_ms": round(max(ms), 1)}


async def _timed(c: httpx.AsyncClient, method: str, path: str, **kw) -> tuple[int, float]:
    """(status code, ms from the client's send to the answer)."""
    t0 = time.perf_counter()
    r = await c.request(method, path, **kw)
    return r.status_code, (time.perf_counter() - t0) * 1e3


async def ask_round(url: str, names: list[str], n: int, seed: int) -> list[tuple[int, float]]:
    """n asks at once on sessions drawn from `names`: [(status code, ms)]."""
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=600,
                                 limits=httpx.Limits(max_connections=n + 10)) as c:
        return await asyncio.gather(*[_timed(c, "POST", "/v1/shadow/ask", json={
            "session": rng.choice(names), **ASK}) for _ in range(n)])


async def wait_round(url: str, n: int, timeout_s: float) -> dict:
    """n asks waiting on a session whose turn stays open (the idle window reads nothing), the
    health route timed 10 times meanwhile."""
    ids = list(range(1000, 1000 + 4 * 64))
    httpx.post(f"{url}/v1/shadow/sessions/held-open/turn", json={"prompt_ids": ids})
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s + 60,
                                 limits=httpx.Limits(max_connections=n + 10)) as c:
        waits = [asyncio.create_task(_timed(c, "POST", "/v1/shadow/ask", json={
            "session": "held-open", **ASK, "wait": True, "timeout_s": timeout_s}))
            for _ in range(n)]
        await asyncio.sleep(0.5)
        health = []
        for _ in range(10):
            health.append((await _timed(c, "GET", "/healthz"))[1])
            await asyncio.sleep(0.1)
        done = await asyncio.gather(*waits)
    codes = {}
    for code, _ in done:
        codes[str(code)] = codes.get(str(code), 0) + 1
    return {"waits": n, "codes": codes, "health_during_waits": percentiles(health),
            "waits_ended": percentiles([ms for _, ms in done])}


def run(args) -> dict:
    """The whole measurement (module doc); the service is stopped at the end."""
    tmp = tempfile.mkdtemp(prefix="shadow-load-")
    proc, url = start(args, tmp)
    try:
        names = fill(url, args)
        rounds = []
        for k in range(args.rounds):
            answers = asyncio.run(ask_round(url, names, args.concurrent, k))
            codes = {}
            for code, _ in answers:
                codes[str(code)] = codes.get(str(code), 0) + 1
            rounds.append({"codes": codes, **percentiles([ms for c, ms in answers if c == 200]),
                           **_proc(proc.pid), **_held(url)})
            print(f"round {k}: {rounds[-1]}", file=sys.stderr, flush=True)
        waited = asyncio.run(wait_round(url, args.waits, args.wait_s))
        print(f"waits: {waited}", file=sys.stderr, flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return {"model": args.model, "device": args.device, "grid": args.grid, "gb": args.gb,
            "sessions": args.sessions, "ids": args.ids, "ask_workers": args.workers,
            "ask_queue": args.queue, "concurrent": args.concurrent, "rounds": rounds,
            "rss_growth_mib": round(rounds[-1]["rss_mib"] - rounds[0]["rss_mib"], 1),
            **waited, "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "date": str(datetime.date.today())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:tiny")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--grid", type=int, default=64)
    ap.add_argument("--gb", type=float, default=0.5, help="SHADOW_GB, the resident cap")
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--ids", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrent", type=int, default=40)
    ap.add_argument("--waits", type=int, default=200)
    ap.add_argument("--wait-s", type=float, default=5.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--queue", type=int, default=32)
    args = ap.parse_args(argv)
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
