"""The service for the tests that need a real one on a loopback port: in a subprocess
(`shadow-reader serve` with `random:tiny` on the CPU and the given SHADOW_* settings, started and
waited for until /healthz says ready, and stopped with SIGTERM (SIGKILL if it hangs)), or in a
thread of the test's process (`Server`: create_app served by uvicorn). Apart from tests/helpers
so that the GPU tests, which use helpers, need no server packages on the device."""
from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

import httpx
import uvicorn

from evals.serve_proc import free_port, start_service, stop_service  # noqa: F401 (free_port)
from shadow_plugin.server.app import create_app
from shadow_plugin.server.config import ServiceConfig

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


class Server:
    """create_app(cfg) served by uvicorn on 127.0.0.1 in a thread, until stop()."""

    def __init__(self, cfg: ServiceConfig):
        self.app = create_app(cfg)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz").json()["state"] == "ready":
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError("the service did not become ready in 60 s")

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the server did not stop"

    @property
    def service(self):
        return self.app.state.service
