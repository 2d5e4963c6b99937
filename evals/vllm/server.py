"""A vLLM OpenAI server in a process of its own, for the vLLM trial (evals/vllm/trial.py) and
the plugin's integration test (tests/integration/test_vllm.py): the command line, the start
(optionally in a session of its own, so it outlives the process that started it), the wait
for readiness, the planned stop, and what its log says about the host (KV-cache capacity,
model runner, CUDA graphs).

The host and the peer are token-id servers (`--skip-tokenizer-init`) of a Qwen3.5 directory in
Qwen's released layout (`shadow-reader export-model`), text only (`--language-model-only`).
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

CONNECTOR = {"kv_connector": "ShadowConnector", "kv_role": "kv_producer"}


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class ServerSpec:
    """model_dir: the Hugging Face directory; name: the served model name; connector: load the
    shadow's connector (and its plugins); max_model_len (ids); gpu_memory_utilization: None
    for vLLM's default; dtype; extra_args: more vLLM flags; env: variables over the caller's
    (the shadow's SHADOW_* among them)."""

    model_dir: str
    name: str = "host"
    connector: bool = True
    max_model_len: int = 4096
    gpu_memory_utilization: float | None = None
    dtype: str = "bfloat16"
    extra_args: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)

    def command(self, port: int) -> list[str]:
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
               self.model_dir, "--host", "127.0.0.1", "--port", str(port),
               "--served-model-name", self.name, "--skip-tokenizer-init",
               "--language-model-only", "--max-model-len", str(self.max_model_len),
               "--dtype", self.dtype]
        if self.gpu_memory_utilization is not None:
            cmd += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.connector:
            cmd += ["--kv-transfer-config", json.dumps(CONNECTOR)]
        return cmd + list(self.extra_args)

    def environment(self) -> dict:
        env = {**os.environ, **self.env}
        # every entry point of ours is named `shadow`; a server without the connector loads
        # none of them (an allowlist naming nothing)
        env["VLLM_PLUGINS"] = "shadow" if self.connector else ""
        return env


class VllmServer:
    """A started server. `start` returns once it answers (`ready_path`: the shadow's status
    says ready with the connector, /v1/models without), or raises naming its log's tail."""

    def __init__(self, spec: ServerSpec, log: Path, port: int | None = None,
                 proc: subprocess.Popen | None = None, pid: int | None = None):
        self.spec, self.log = spec, Path(log)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc, self._pid = proc, pid
        self._local = threading.local()           # each thread's httpx client (`http`)
        self._clients: list[httpx.Client] = []    # all of them, for close_clients
        self._clients_lock = threading.Lock()

    @property
    def http(self) -> httpx.Client:
        """This thread's client for the server, its connections kept between requests. The
        top-level httpx calls build a client (an SSL context included) for every request:
        47-49 ms on a 2-core CPU, which a timed request would count as the server's
        (2026-12-05, vLLM's CPU engine: an ask 67.0 ms that way, 19.0 ms with one client;
        BENCHMARKS.md, docs/ask-overhead-cpu-2026-12-05.log). Closed by
        `stop` (close_clients); a closed one is replaced."""
        client = getattr(self._local, "client", None)
        if client is None or client.is_closed:
            client = self._local.client = httpx.Client(timeout=600)
            with self._clients_lock:
                self._clients = [c for c in self._clients if not c.is_closed] + [client]
        return client

    def close_clients(self) -> None:
        """Close every thread's client (their kept connections); a later `http` makes a new
        one. `stop` calls it once the server is gone."""
        with self._clients_lock:
            clients, self._clients = self._clients, []
        for c in clients:
            c.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else self._pid

    @classmethod
    def launch(cls, spec: ServerSpec, log: Path, detached: bool = False) -> "VllmServer":
        """Start the process and return at once (wait_ready waits). detached: in a session of
        its own (it outlives this process; stop it by pid)."""
        server = cls(spec, log)
        server.log.parent.mkdir(parents=True, exist_ok=True)
        with open(server.log, "w") as out:
            server.proc = subprocess.Popen(spec.command(server.port), env=spec.environment(),
                                           stdout=out, stderr=subprocess.STDOUT,
                                           start_new_session=detached)
        server._detached = detached
        return server

    @classmethod
    def start(cls, spec: ServerSpec, log: Path, timeout_s: float,
              detached: bool = False) -> "VllmServer":
        """launch, then wait_ready (its errors)."""
        server = cls.launch(spec, log, detached)
        server.wait_ready(timeout_s)
        return server

    def tail(self, num_chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-num_chars:]
        except OSError as e:
            return f"(no log: {e})"

    @property
    def detached(self) -> bool:
        """Started in a session of its own (or known only by its pid)."""
        return self.proc is None or getattr(self, "_detached", False)

    def present(self) -> bool:
        """Whether the server or what is left of it may hold the GPU: its API process alive,
        or a process of its group (alive or group_alive)."""
        return self.alive() or self.group_alive()

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        try:
            os.kill(self.pid, 0)
            return True
        except OSError:
            return False

    def state(self) -> str | None:
        """"ready" once it answers (with the connector: the shadow's status state, which is
        "loading", "ready" or "failed"), None while it does not answer."""
        try:
            if self.spec.connector:
                return self.http.get(self.url + "/v1/shadow/status", timeout=5).json().get("state")
            ok = self.http.get(self.url + "/v1/models", timeout=5).status_code == 200
            return "ready" if ok else None
        except (httpx.HTTPError, ValueError):
            return None

    def ready(self) -> bool:
        return self.state() == "ready"

    def wait_ready(self, timeout_s: float, kill_after: bool = True) -> None:
        """Wait until ready. RuntimeError (with the log's tail) when the server exits or the
        shadow's load failed; TimeoutError after timeout_s (the server killed when
        kill_after)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"vLLM exited while starting: {self.tail()}")
            state = self.state()
            if state == "ready":
                return
            if state == "failed":
                raise RuntimeError(f"the shadow failed to load: {self.status().get('error')}"
                                   f"\n{self.tail()}")
            time.sleep(1)
        if kill_after:
            self.stop(signal.SIGKILL)
        raise TimeoutError(f"vLLM not ready in {timeout_s} s: {self.tail()}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 180) -> int | None:
        """Send `sig` to the API server's process alone (a planned stop: the shadow writes its
        sessions first) and wait for it, then for its engine's processes (a detached server's
        process group) to be gone, so that its GPU memory is free; SIGKILL after timeout_s.
        Its exit status (None for a detached server this process did not start). The default
        timeout outlasts the plugin's own wait for the shadow's writes (120 s)."""
        deadline = time.monotonic() + timeout_s
        if self.alive():
            os.kill(self.pid, sig)
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        code = self.proc.wait() if self.proc is not None else None
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.group_alive():
            os.killpg(self.pid, signal.SIGKILL)
        self.close_clients()                      # their connections were to the server
        return code

    def group_alive(self) -> bool:
        """Whether a process of the server's own session (detached: its group) is left: its
        engine outlives the API process for a while after a stop (the shadow writes its
        sessions), or for good after the API process crashed."""
        if self.proc is not None and not self.detached:
            return False
        try:
            os.killpg(self.pid, 0)
            return True
        except OSError:
            return False

    def status(self) -> dict:
        """The shadow's status route."""
        return self.http.get(self.url + "/v1/shadow/status", timeout=60).json()

    def to_json(self) -> dict:
        return {"spec": {**self.spec.__dict__, "extra_args": list(self.spec.extra_args)},
                "log": str(self.log), "port": self.port, "pid": self.pid}

    @classmethod
    def from_json(cls, data: dict) -> "VllmServer":
        spec = ServerSpec(**{**data["spec"], "extra_args": tuple(data["spec"]["extra_args"])})
        return cls(spec, Path(data["log"]), data["port"], pid=data["pid"])


# What vLLM's log says about the host. vLLM 0.26-0.33 print these lines (checked in their
# sources): "GPU KV cache size: 1,234,567 tokens", "Using V2 Model Runner" (only with V2),
# and the engine's config line with "cudagraph_mode": <CUDAGraphMode.X: ...>.
KV_TOKENS_RE = re.compile(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens")
KV_GIB_RE = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
CUDAGRAPH_RE = re.compile(r"['\"]cudagraph_mode['\"]: <?CUDAGraphMode\.(\w+)")


def log_facts(text: str) -> dict:
    """From a vLLM server's log: kv_cache_tokens (the "GPU KV cache size" line), kv_cache_gib,
    model_runner ("v2" when vLLM said it uses Model Runner V2, else "v1"), cudagraph_mode (the
    engine config's, None when not printed), the shadow's own line (connector.host_info's
    log) and whether the log holds a traceback."""
    tokens = KV_TOKENS_RE.findall(text)
    gib = KV_GIB_RE.findall(text)
    graphs = CUDAGRAPH_RE.findall(text)
    shadow = [line.split("shadow: ", 1)[1] for line in text.splitlines()
              if "shadow: following vLLM" in line]
    return {"kv_cache_tokens": int(tokens[-1].replace(",", "")) if tokens else None,
            "kv_cache_gib": float(gib[-1]) if gib else None,
            "model_runner": "v2" if "Using V2 Model Runner" in text else "v1",
            "cudagraph_mode": graphs[-1] if graphs else None,
            "shadow_line": shadow[-1] if shadow else None,
            "traceback": "Traceback (most recent call last)" in text}
