"""What vLLM's door adds to a question: the HTTP time of `POST /v1/shadow/ask` minus the
worker's own time (the answer's `ms`), for two trees side by side on vLLM's CPU engine (A: an
older checkout, B: this one), each a server of its own (the tree on PYTHONPATH, so vLLM's
entry points load its plugins), the asks alternating A and B, the order swapped every round.

    python -m evals.ask_overhead --a /path/to/old/checkout [--asks 30] [--ids 2048] [--busy]

--busy: each host decodes all the while (back-to-back requests of 256 ids of another session),
so the asks come while the engine has requests, as an agent's questions do.

Setup: the host `export-model random:tiny-host`, the shadow `random:tiny` on the CPU at grid
64, one session of --ids ids (one /v1/completions request), read to its end before the asks;
the 2-id question of tests/integration/test_vllm.py. The last line printed is JSON: per arm the
medians and p90 of HTTP, worker and overhead ms, and B's `shadow_answer_replies_total` lines.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from evals.run_info import git_commit
from evals.vllm.server import ServerSpec, VllmServer

G = 64
QUESTION = {"question": "Is this about code?", "choices": ["yes", "no"]}


def start(tree: Path, host_dir: Path, work: Path, name: str) -> VllmServer:
    env = {"PYTHONPATH": str(tree), "VLLM_CPU_KVCACHE_SPACE": "1",
           "SHADOW_MODEL": "random:tiny", "SHADOW_DEVICE": "cpu", "SHADOW_GRID": str(G),
           "SHADOW_DIR": str(work / name), "SHADOW_THREADS": "1", "SHADOW_POLL_S": "0.05"}
    spec = ServerSpec(str(host_dir), "host", True, 4096, env=env)
    return VllmServer.launch(spec, work / f"{name}.log")


def follow(server: VllmServer, ids: list[int], timeout_s: float = 300) -> None:
    """One request of `ids` as session "q", then wait until the shadow's backlog is < G."""
    r = server.http.post(server.url + "/v1/completions", timeout=300, json={
        "model": "host", "prompt": ids, "max_tokens": 4, "temperature": 0,
        "return_token_ids": True, "kv_transfer_params": {"shadow_session": "q"}})
    r.raise_for_status()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        per = server.http.get(server.url + "/v1/shadow/status", timeout=30).json()["sessions"]
        if "q" in per and per["q"]["backlog"] < G:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{server.url}: the session was not read in {timeout_s} s")


def ask(server: VllmServer) -> tuple[float, float]:
    """(HTTP ms, the worker's ms) of one question."""
    t0 = time.perf_counter()
    r = server.http.post(server.url + "/v1/shadow/ask", timeout=60,
                         json={"session": "q", **QUESTION})
    http_ms = (time.perf_counter() - t0) * 1e3
    r.raise_for_status()
    return http_ms, r.json()["ms"]


def keep_busy(server: VllmServer, stop: threading.Event, num_tokens: int) -> None:
    """Back-to-back greedy requests of num_tokens ids (session "busy") until `stop`."""
    prompt = [random.Random(1).randrange(1000, 240000) for _ in range(200)]
    while not stop.is_set():
        server.http.post(server.url + "/v1/completions", timeout=300, json={
            "model": "host", "prompt": prompt, "max_tokens": num_tokens, "temperature": 0,
            "ignore_eos": True, "kv_transfer_params": {"shadow_session": "busy"}})


def summary(samples: list[tuple[float, float]]) -> dict:
    def stats(xs):
        xs = sorted(xs)
        return {"median": round(statistics.median(xs), 2),
                "p90": round(xs[int(0.9 * (len(xs) - 1))], 2)}
    return {"http_ms": stats([h for h, _ in samples]), "worker_ms": stats([w for _, w in samples]),
            "overhead_ms": stats([h - w for h, w in samples]), "num_asks": len(samples)}


def run(args) -> dict:
    from evals.cli import main as cli
    work = Path(tempfile.mkdtemp(prefix="ask-overhead-"))
    host_dir = work / "tiny-host"
    assert cli(["export-model", "random:tiny-host", str(host_dir)]) == 0
    trees = {"a": Path(args.a).resolve(), "b": Path(args.b).resolve()}
    servers = {arm: start(tree, host_dir, work, arm) for arm, tree in trees.items()}
    try:
        for s in servers.values():
            s.wait_ready(args.start_timeout_s)
        rng = random.Random(0)
        ids = [rng.randrange(1000, 240000) for _ in range(args.ids)]
        for s in servers.values():
            follow(s, ids)
        stop, busy = threading.Event(), []
        if args.busy:
            busy = [threading.Thread(target=keep_busy, args=(srv, stop, 256), daemon=True)
                    for srv in servers.values()]
            for t in busy:
                t.start()
            time.sleep(2)
        try:
            for _ in range(args.warm):
                for s in servers.values():
                    ask(s)
            samples: dict[str, list] = {arm: [] for arm in servers}
            for k in range(args.asks):
                for arm in (("a", "b") if k % 2 == 0 else ("b", "a")):
                    samples[arm].append(ask(servers[arm]))
        finally:
            stop.set()
            for t in busy:
                t.join(300)
        time.sleep(2)                                  # the endpoint's metrics refresh
        replies = [line for line in servers["b"].http.get(servers["b"].url + "/metrics", timeout=30)
                   .text.splitlines() if line.startswith("shadow_answer_replies_total")]
    finally:
        for s in servers.values():
            s.stop()
    out = {arm: {"tree": str(trees[arm]), "commit": git_commit(trees[arm]),
                 **summary(samples[arm])} for arm in servers}
    out["b_answer_replies"] = replies
    out["b_minus_a_overhead_ms"] = round(out["b"]["overhead_ms"]["median"]
                                         - out["a"]["overhead_ms"]["median"], 2)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="the older checkout (arm A)")
    ap.add_argument("--b", default=".", help="the newer checkout (arm B; default: this one)")
    ap.add_argument("--asks", type=int, default=30, help="asks an arm, after the warm-ups")
    ap.add_argument("--warm", type=int, default=5, help="warm-up asks an arm")
    ap.add_argument("--ids", type=int, default=2048, help="the session's ids")
    ap.add_argument("--busy", action="store_true", help="the hosts decode during the asks")
    ap.add_argument("--start-timeout-s", type=float, default=420)
    args = ap.parse_args(argv)
    import torch
    import vllm
    res = run(args)
    res.update({"busy": args.busy, "device": "cpu", "vllm": vllm.__version__,
                "torch": torch.__version__, "model": "random:tiny", "host": "random:tiny-host",
                "grid": G,
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
