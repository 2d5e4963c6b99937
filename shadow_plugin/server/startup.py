"""What `serve` checks before it binds and says when it starts: the folders it writes (the disk
tier, the journal) and the profiles file, checked with errors that name their variable; the
port (taken or not allowed: one line, exit 2, no traceback); the start-up lines naming the
model, device, grid, cap, disk folder, journal, threads and the question pool, and a warning
for a bind beyond the loopback without a key."""
from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import torch

from shadow_plugin.server.config import ServiceConfig, default_threads
from shadow_plugin.server.limits import LOOPBACK

MIN_CAP_GB = 2**-14         # 64 KiB: a cap under one page of the tiny model is a mistake

def check_folder(path: Path, variable: str) -> None:
    """The folder exists or can be made, and a file can be written in it (ValueError naming
    `variable` and the path)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".shadow-check-"):
            pass
    except OSError as e:
        raise ValueError(f"{variable}={str(path)!r}: cannot write there ({e.strerror or e})"
                         ) from None


def check_paths(cfg: ServiceConfig) -> None:
    """SHADOW_DISK (when set) and SHADOW_DIR are writable folders; SHADOW_GB and SHADOW_DISK_GB
    are positive (ValueError naming the variable)."""
    if not MIN_CAP_GB <= cfg.resident_gb < float("inf"):
        raise ValueError(f"SHADOW_GB={cfg.resident_gb}: the resident cap must be at least "
                         f"{MIN_CAP_GB} GiB")
    kind, _, index = cfg.device.partition(":")
    if kind not in ("", "cpu", "cuda") or (index and not (kind == "cuda" and index.isdigit())):
        raise ValueError(f"SHADOW_DEVICE / --device {cfg.device!r}: cpu, cuda or cuda:N")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"SHADOW_DEVICE / --device {cfg.device!r}: no CUDA device is "
                         "available here")
    if index and int(index) >= torch.cuda.device_count():
        raise ValueError(f"SHADOW_DEVICE / --device {cfg.device!r}: this machine has "
                         f"{torch.cuda.device_count()} CUDA devices")
    if not cfg.max_body_bytes > 0:
        raise ValueError(f"SHADOW_MAX_BODY_MB={cfg.max_body_bytes / 2**20}: must be positive")
    if cfg.disk_gb is not None and not cfg.disk_gb > 0:
        raise ValueError(f"SHADOW_DISK_GB={cfg.disk_gb}: the disk cap must be a positive "
                         "number of GiB")
    if not cfg.disk_ttl_h > 0:
        raise ValueError(f"SHADOW_DISK_TTL_H={cfg.disk_ttl_h}: files must live a positive "
                         "number of hours")
    if cfg.disk_grace_s is not None and not cfg.disk_grace_s >= 0:
        raise ValueError(f"SHADOW_DISK_GRACE_S={cfg.disk_grace_s}: the grace period must be "
                         "0 or more seconds")
    if cfg.prefetch_gb is not None and not 0 <= cfg.prefetch_gb < float("inf"):
        raise ValueError(f"SHADOW_PREFETCH_GB={cfg.prefetch_gb}: the read-ahead's memory must "
                         "be 0 or more GiB")
    if cfg.disk_dir is not None:
        check_folder(cfg.disk_dir, "SHADOW_DISK")
    check_folder(cfg.state_dir, "SHADOW_DIR")


def bind_check(host: str, port: int) -> None:
    """ValueError (one line naming --host/--port) when the address cannot be bound now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise ValueError(f"--host {host} --port {port}: cannot bind ({e.strerror or e})"
                         ) from None


def startup_lines(cfg: ServiceConfig, host: str, port: int) -> list[str]:
    """The lines `serve` prints before it binds."""
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    weights = "seeded random weights" if cfg.model.startswith("random:") else "real weights"
    disk = (f"disk {cfg.disk_dir}" + (f" (cap {cfg.disk_gb} GiB)" if cfg.disk_gb else "")
            if cfg.disk_dir else "disk off (SHADOW_DISK: a restart remembers nothing)")
    shown = f"[{host}]" if ":" in host else host
    lines = [f"model {cfg.model} ({weights}) on {device}, grid {cfg.grid}, cap "
             f"{cfg.resident_gb} GiB, {disk}, journal {cfg.state_dir / 'shadow.jsonl'}, "
             f"threads {cfg.threads or default_threads()}, questions {cfg.ask_workers} at once "
             f"+ {cfg.ask_queue} queued, idle reads of up to {cfg.scheduler.batch_sessions} "
             f"session(s) a forward (SHADOW_BATCH_SESSIONS)",
             f"dashboard at http://{shown}:{port}/v1/shadow/dashboard"]
    if host not in LOOPBACK and not cfg.api_key:
        lines.append(f"WARNING: bound to {host} without an API key: anyone who reaches it can "
                     "drive and read the shadow (set SHADOW_API_KEY)")
    return lines
