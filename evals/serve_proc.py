"""`shadow-reader serve` in a subprocess, for the benchmarks that need a real service process
(evals/load.py, evals/stall.py, evals/move.py) and the tests that do (tests/serving.py): start,
stop, and a session's turn and catch-up over HTTP."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(env: dict[str, str], port: int, timeout_s: float,
                  poll_s: float = 0.1) -> tuple[subprocess.Popen, str]:
    """`python -m evals.cli serve --port PORT` with `env` (its output discarded): (the
    process, its URL) once /healthz says ready, polled every poll_s s. Raises TimeoutError
    (the process killed) when it is not ready within timeout_s."""
    proc = subprocess.Popen([sys.executable, "-m", "evals.cli", "serve", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz").json()["state"] == "ready":
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    proc.kill()
    raise TimeoutError(f"the service did not become ready in {timeout_s} s")


def stop_service(proc: subprocess.Popen, timeout_s: float = 30.0) -> int:
    """A planned stop (SIGTERM: every resident session written), then SIGKILL after
    timeout_s. Returns the exit status."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def status(url: str) -> dict:
    """GET /v1/shadow/status."""
    return httpx.get(f"{url}/v1/shadow/status", timeout=60).json()


def turn(url: str, sid: str, prompt: list[int], output: list[int]) -> float:
    """One host turn of session `sid`: its prompt (POST .../turn), its output at the prompt's
    end (.../output) and its end (.../end). Returns the /turn call's wall time in s (where a
    server that does not hold the session restores it). Raises AssertionError naming the call
    that did not answer 200."""
    t0 = time.perf_counter()
    r = httpx.post(f"{url}/v1/shadow/sessions/{sid}/turn", json={"prompt_ids": prompt},
                   timeout=600)
    turn_s = time.perf_counter() - t0
    assert r.status_code == 200, f"turn: {r.status_code} {r.text}"
    r = httpx.post(f"{url}/v1/shadow/sessions/{sid}/output",
                   json={"ids": output, "position": len(prompt)}, timeout=600)
    assert r.status_code == 200, f"output: {r.status_code} {r.text}"
    r = httpx.post(f"{url}/v1/shadow/sessions/{sid}/end", timeout=600)
    assert r.status_code == 200, f"end: {r.status_code} {r.text}"
    return turn_s


def caught_up(url: str, sid: str, num_ids: int, grid: int, timeout_s: float = 60.0,
              poll_s: float = 0.05) -> dict:
    """The server's status once it has read every whole page of the session's num_ids ids
    (polled every poll_s s). Raises TimeoutError when it has not within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = status(url)
        if s["sessions"].get(sid, {}).get("committed", -1) >= num_ids // grid * grid:
            return s
        time.sleep(poll_s)
    raise TimeoutError(f"{url} did not read {sid} up to {num_ids // grid * grid} in "
                       f"{timeout_s} s")
