"""The service in a subprocess for the tests that need a real one on a loopback port:
`shadow-reader serve` with `random:tiny` on the CPU and the given SHADOW_* settings, started and
waited for until /healthz says ready, and stopped with SIGTERM (SIGKILL if it hangs)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx

BASE = {"SHADOW_MODEL": "random:tiny", "SHADOW_DEVICE": "cpu", "SHADOW_POLL_S": "0.02"}


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(settings: dict[str, str], port: int, timeout_s: float = 120.0
          ) -> tuple[subprocess.Popen, str]:
    """(the process, its URL) once /healthz says ready; AssertionError (the process killed)
    when it is not ready within timeout_s."""
    env = {**os.environ, **BASE, **settings}
    proc = subprocess.Popen([sys.executable, "-m", "evals.cli", "serve", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz").json()["state"] == "ready":
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the service did not become ready in {timeout_s} s")


def stop(proc: subprocess.Popen) -> None:
    """A planned stop (SIGTERM), then SIGKILL after 30 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
