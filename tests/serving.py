"""The service in a subprocess for the tests that need a real one on a loopback port:
`shadow-reader serve` with `random:tiny` on the CPU and the given SHADOW_* settings, started and
waited for until /healthz says ready, and stopped with SIGTERM (SIGKILL if it hangs)."""
from __future__ import annotations

import os
import subprocess

from evals.serve_proc import free_port, start_service, stop_service  # noqa: F401 (free_port)

BASE = {"SHADOW_MODEL": "random:tiny", "SHADOW_DEVICE": "cpu", "SHADOW_POLL_S": "0.02"}


def start(settings: dict[str, str], port: int, timeout_s: float = 120.0
          ) -> tuple[subprocess.Popen, str]:
    """(the process, its URL) once /healthz says ready; AssertionError (the process killed)
    when it is not ready within timeout_s."""
    try:
        return start_service({**os.environ, **BASE, **settings}, port, timeout_s)
    except TimeoutError as e:
        raise AssertionError(str(e)) from None


def stop(proc: subprocess.Popen) -> None:
    """A planned stop (SIGTERM), then SIGKILL after 30 s."""
    stop_service(proc, 30)
