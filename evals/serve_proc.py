"""`shadow-reader serve` in a subprocess, for the load benchmark (evals/load.py) and the tests
that need a real service process (tests/serving.py)."""
from __future__ import annotations

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
