"""How long a long question, summary or check makes another session's host calls wait.

Issue 34: a real `serve` subprocess on a loopback port, one session read to its end, then,
while one ask with a long question runs (then one summary of many tokens, then the session's
`/check`: a fresh prefill of its ids), another session's `turn`,
`output` and `end` and `/v1/shadow/status` are called back to back and each call timed. The
figure is the longest wait of a `turn`; the time of one chunk (the reader's own mean read time
a chunk, from status) is given beside it, and the ratio of the two.

    python -m evals.stall [--model random:tiny] [--device cpu] [--grid 512] [--ids 4096]
        [--question-chars 32000] [--summary-tokens 1024] [--cases question,summary,check]

The last line printed is one JSON object (with the machine, versions, commit and date). Its
figures go in BENCHMARKS.md; nothing here asserts a latency.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import torch

from evals.run_info import git_commit
from evals.serve_proc import free_port, start_service

OTHER = "stall-other"
LONG = "stall-long"
CASES = ("question", "summary", "check")


def question_text(num_chars: int, seed: int = 0) -> str:
    """num_chars characters of seeded random words (about two characters an id)."""
    rng, words = random.Random(seed), []
    while sum(len(w) + 1 for w in words) < num_chars:
        words.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                             for _ in range(rng.randrange(1, 6))))
    return " ".join(words)[:num_chars]


def start(args, tmp: str) -> tuple[subprocess.Popen, str]:
    """The service, ready (limits raised so the long question and summary are let in)."""
    env = {**os.environ, "SHADOW_MODEL": args.model, "SHADOW_DEVICE": args.device,
           "SHADOW_GRID": str(args.grid), "SHADOW_DIR": tmp,
           "SHADOW_MAX_QUESTION_TOKENS": str(4 * args.question_chars),
           "SHADOW_MAX_SUMMARY_TOKENS": str(max(args.summary_tokens, 4096))}
    try:
        return start_service(env, free_port(), timeout_s=300, poll_s=0.2)
    except TimeoutError:
        raise RuntimeError("the service did not start") from None


def fill(c: httpx.Client, args) -> float:
    """The long session read to its end and the other session started; returns the reader's
    mean time a chunk, in ms (status totals)."""
    rng = random.Random(1)
    ids = [rng.randrange(1000, 240000) for _ in range(args.ids)]
    c.post(f"/v1/shadow/sessions/{LONG}/turn", json={"prompt_ids": ids}).raise_for_status()
    c.post(f"/v1/shadow/sessions/{LONG}/end").raise_for_status()
    c.post("/v1/shadow/ask", json={"session": LONG, "question": "Code?",
                                   "choices": ["yes", "no"], "wait": True,
                                   "timeout_s": 600}).raise_for_status()
    totals = c.get("/v1/shadow/status").json()["totals"]
    return totals["read_ms"] / max(totals["num_chunks"], 1)


def host_calls(c: httpx.Client, done: threading.Event, session: str = OTHER,
               prompt_ids: list[int] | None = None) -> dict[str, list[float]]:
    """Session `session`'s turn (prompt_ids, by default ids 1000-1099), output (2 ids), end
    and the status, back to back until `done`: each call's wall time in ms, by call. Raises
    httpx.HTTPStatusError for a call that is not answered 2xx."""
    prompt = list(range(1000, 1100)) if prompt_ids is None else prompt_ids
    waits: dict[str, list[float]] = {"turn": [], "output": [], "end": [], "status": []}
    calls = (("turn", "post", f"/v1/shadow/sessions/{session}/turn", {"prompt_ids": prompt}),
             ("output", "post", f"/v1/shadow/sessions/{session}/output", {"ids": [1200, 1201]}),
             ("end", "post", f"/v1/shadow/sessions/{session}/end", None),
             ("status", "get", "/v1/shadow/status", None))
    while not done.is_set():
        for name, method, path, body in calls:
            t0 = time.perf_counter()
            r = c.request(method.upper(), path, json=body)
            waits[name].append((time.perf_counter() - t0) * 1e3)
            r.raise_for_status()
    return waits


def beside_host_calls(c: httpx.Client, path: str, body: dict | None,
                      **host_kw) -> tuple[httpx.Response, float, dict[str, list[float]]]:
    """Run one question or summary (POST `path` with `body`), or a check (GET `path`: `body`
    None), in a thread while host_calls(**host_kw) runs: (its reply, its wall time in ms,
    each host call's waits in ms, by call)."""
    done, out = threading.Event(), {}

    def job():
        t0 = time.perf_counter()
        try:
            out["reply"] = c.post(path, json=body) if body is not None else c.get(path)
        finally:
            out["ms"] = (time.perf_counter() - t0) * 1e3
            done.set()

    worker = threading.Thread(target=job)
    worker.start()
    time.sleep(0.05)                       # the job holds the reader first
    waits = host_calls(c, done, **host_kw)
    worker.join()
    return out["reply"], out["ms"], waits


def stalled(c: httpx.Client, path: str, body: dict | None) -> tuple[dict, dict]:
    """beside_host_calls, summed up: the job's code and wall time, and the longest and median
    waits of each host call (ms); and the job's answer."""
    reply, job_ms, waits = beside_host_calls(c, path, body)
    res = {"code": reply.status_code, "job_s": round(job_ms / 1e3, 2)}
    for name, ms in waits.items():
        ms = sorted(ms)
        res[f"{name}_max_ms"] = round(ms[-1], 1)
        res[f"{name}_p50_ms"] = round(ms[len(ms) // 2], 1)
        res[f"num_{name}_calls"] = len(ms)
    return res, reply.json()


def measure(c: httpx.Client, case: str, args) -> dict:
    """One case beside the host calls (`stalled`), with what it did: the question's forwarded
    ids, the summary's tokens, the check's ids and whether it was exact."""
    if case == "question":
        res, ans = stalled(c, "/v1/shadow/ask", {
            "session": LONG, "question": question_text(args.question_chars),
            "choices": ["yes", "no"]})
        res["num_forwarded_tokens"] = ans.get("num_forwarded_tokens")
    elif case == "summary":
        res, gen = stalled(c, "/v1/shadow/summarize", {
            "session": LONG, "max_tokens": args.summary_tokens})
        res["num_tokens"] = len(gen.get("ids", []))
    else:
        res, report = stalled(c, f"/v1/shadow/sessions/{LONG}/check", None)
        res["committed"], res["exact"] = report.get("committed"), report.get("exact")
    print(f"{case}: {res}", file=sys.stderr, flush=True)
    return res


def run(args) -> dict:
    """The whole measurement (module doc); the service is stopped at the end."""
    tmp = tempfile.mkdtemp(prefix="shadow-stall-")
    proc, url = start(args, tmp)
    try:
        with httpx.Client(base_url=url, timeout=1200) as c:
            chunk_ms = fill(c, args)
            c.post(f"/v1/shadow/sessions/{OTHER}/turn",
                   json={"prompt_ids": list(range(1000, 1100))}).raise_for_status()
            cases = {case: measure(c, case, args) for case in args.cases}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    for part in cases.values():
        part["turn_max_over_chunk"] = round(part["turn_max_ms"] / chunk_ms, 2)
    return {"model": args.model, "device": args.device, "grid": args.grid,
            "session_ids": args.ids, "question_chars": args.question_chars,
            "summary_tokens": args.summary_tokens, "chunk_ms": round(chunk_ms, 1),
            **cases, "commit": git_commit(),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "torch": torch.__version__, "python": platform.python_version(),
            "date": str(datetime.date.today())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:tiny")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--grid", type=int, default=512)
    ap.add_argument("--ids", type=int, default=4096, help="ids of the session asked about")
    ap.add_argument("--question-chars", type=int, default=32_000)
    ap.add_argument("--summary-tokens", type=int, default=1024)
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"which to measure, in order (of {', '.join(CASES)})")
    args = ap.parse_args(argv)
    args.cases = [case.strip() for case in args.cases.split(",") if case.strip()]
    if not args.cases or set(args.cases) - set(CASES):
        ap.error(f"--cases: one or more of {', '.join(CASES)}")
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
