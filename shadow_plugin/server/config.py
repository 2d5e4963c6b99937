"""Service configuration: environment variables read in one place, into a frozen dataclass.

SHADOW_MODEL (required: a model directory or random:NAME), SHADOW_DEVICE, SHADOW_DIR (journal
and state, default ~/.shadow-reader), SHADOW_GB (resident cap, GiB), SHADOW_GRID, SHADOW_DISK
("auto" = a cache folder under the home directory, "off", or a path), SHADOW_DISK_GB,
SHADOW_DISK_SHARED (1: other servers use the folder too), SHADOW_DISK_GRACE_S,
SHADOW_PREFETCH_GB (host memory for page files read ahead of restores),
SHADOW_API_KEY, SHADOW_MAX_BODY_MB, SHADOW_PROFILES (a YAML file), SHADOW_HISTORY_S (the
dashboard's sampling interval, s) and SHADOW_HISTORY_SAMPLES (its ring's size),
SHADOW_ASK_WORKERS and SHADOW_ASK_QUEUE (the question pool), SHADOW_ASK_MAX_CATCHUP_TOKENS (the
most ids a question reads first), SHADOW_MAX_QUESTION_TOKENS and SHADOW_MAX_SUMMARY_TOKENS (the
most ids a question renders to, the most tokens a summary decodes), SHADOW_MAX_QUESTIONS (the
most questions one ask may hold), SHADOW_MAX_POSITIONS_POLICY (refuse or cap), SHADOW_THREADS
(torch's CPU threads), SHADOW_ATTENTION (the CUDA runners' attention: fa4 or table; default
fa4 on Hopper with flash-attn-4, else table; refused on the CPU), SHADOW_METRICS_SESSIONS
(sessions with /metrics series of their own), SHADOW_TAILS (questions' tails kept:
Reader's max_tails, 8; 0: none); the scheduler's SHADOW_POLL_S,
SHADOW_IDLE_BURST_S, SHADOW_SHARE, SHADOW_SLICE_MS, SHADOW_TURN_TIMEOUT_S,
SHADOW_IDLE_TRUST, SHADOW_IDLE_AT_FINISH, SHADOW_BATCH_SESSIONS (scheduler.SchedulerConfig);
SHADOW_AUTOTUNE_DIR (fla's kernel configs, read where fla is loaded: model.kernels,
model.autotune). CLI flags override.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from shadow_plugin.scheduling.scheduler import SchedulerConfig
from shadow_plugin.server.metrics import MAX_SESSION_SERIES

MAX_QUESTIONS = 256      # the ceiling of SHADOW_MAX_QUESTIONS, and the request schema's bound


def _get(env, key: str) -> str | None:
    return env.get(f"SHADOW_{key}") or None


def _num(env, key: str, default, kind=float):
    raw = _get(env, key)
    if raw is None:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"SHADOW_{key}={raw!r} is not a number") from None


def _flag(env, key: str) -> bool:
    """SHADOW_{key}: 1/true/yes/on or 0/false/no/off (default off); ValueError else."""
    raw = (_get(env, key) or "0").strip().lower()
    if raw not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ValueError(f"SHADOW_{key}={raw!r} is not 0 or 1")
    return raw in ("1", "true", "yes", "on")


def _catchup(env) -> int | None:
    """SHADOW_ASK_MAX_CATCHUP_TOKENS: ids, or "none" for no bound (default 131,072)."""
    raw = _get(env, "ASK_MAX_CATCHUP_TOKENS")
    if raw is not None and raw.strip().lower() == "none":
        return None
    return _num(env, "ASK_MAX_CATCHUP_TOKENS", 131_072, int)


def default_threads() -> int:
    """torch's CPU threads when none are set: half the cores this process may use (at least
    1): torch takes every core by default, which a busy machine pays for many times over (the
    README's replay took 91.6 s against 11.7 s with one thread on a loaded 2-core machine)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:                 # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // 2)


@dataclass(frozen=True)
class ServiceConfig:
    """model: a HF directory or random:NAME (empty: the service refuses to start); device: cpu,
    cuda or "" (auto); state_dir: journal folder; resident_gb; grid; disk_dir (None: off);
    disk_gb (None: no cap); disk_ttl_h (files older than this are deleted, hours);
    disk_shared (other servers use the folder too: StoreConfig.disk_shared); disk_grace_s
    (files younger than this, s, are never deleted; None: 60 with disk_shared, else 0);
    prefetch_gb (host memory for page files read ahead of restores, GiB; None: half of
    resident_gb, at most 2; 0: none); api_key (None: no key); max_body_bytes; max_ids (per request);
    profiles_path (server.router_journal.load_profiles); scheduler; bind_host (the address
    served; on a loopback address the Host header must name the loopback); history_every_s,
    history_samples: the dashboard's history (server.history.History: one sample every
    history_every_s s, the last history_samples kept); ask_workers, ask_queue: questions run at
    once and waiting for a worker (server.ask_pool.AskPool); ask_max_catchup_tokens: the most
    ids a question may read before its forward (None: no bound); max_question_tokens: the
    most ids a question (or a summary's instruction) may render to (413 past it);
    max_summary_tokens: the most tokens a summary may decode (400 past it); max_questions: the
    most questions one ask may hold (answered in one forward; 400 past it); max_positions_policy:
    "refuse" a prompt past the model's positions, or "cap" it (the session holds the first
    max positions); threads: torch's CPU threads (default_threads()); metrics_sessions: how
    many sessions get /metrics series of their own (server.metrics: the warmest, the largest
    backlogs; 0: none); max_tails: questions' tails the reader keeps (Reader's max_tails:
    a page and a GDN state each, within resident_gb; 0: none)."""

    model: str = ""
    device: str = ""
    state_dir: Path = Path.home() / ".shadow-reader"
    resident_gb: float = 4.0
    grid: int = 512
    disk_dir: Path | None = None
    disk_gb: float | None = None
    disk_ttl_h: float = 48.0
    disk_shared: bool = False
    disk_grace_s: float | None = None
    prefetch_gb: float | None = None
    api_key: str | None = None
    max_body_bytes: int = 64 * 2**20
    max_ids: int = 4 * 2**20
    profiles_path: Path | None = None
    scheduler: SchedulerConfig = SchedulerConfig()
    bind_host: str = "127.0.0.1"
    history_every_s: float = 1.0
    history_samples: int = 3600
    ask_workers: int = 2
    ask_queue: int = 32
    ask_max_catchup_tokens: int | None = 131_072
    max_question_tokens: int = 32_768
    max_summary_tokens: int = 4096
    max_questions: int = 8
    max_positions_policy: str = "refuse"
    threads: int | None = None
    attention: str | None = None         # the CUDA runners' (adapters.runners.graphs.ATTENTIONS)
    metrics_sessions: int = MAX_SESSION_SERIES
    max_tails: int = 8

    @classmethod
    def from_env_with(cls, extra: dict | None, env=None) -> "ServiceConfig":
        """from_env with `extra`'s entries over the variables (a key SHADOW_NAME or NAME, any
        case; a value as its text): vLLM's kv_connector_extra_config. ValueError naming a
        variable that does not parse."""
        merged = dict(os.environ if env is None else env)
        for key, value in (extra or {}).items():
            name = str(key).upper()
            merged[name if name.startswith("SHADOW_") else f"SHADOW_{name}"] = str(value)
        return cls.from_env(merged)

    @classmethod
    def from_env(cls, env=None) -> "ServiceConfig":
        """Read the variables above; ValueError naming a variable that does not parse."""
        env = os.environ if env is None else env
        state_dir = Path(_get(env, "DIR") or Path.home() / ".shadow-reader").expanduser()
        disk = (_get(env, "DISK") or "off").strip()
        disk_dir = {"off": None, "auto": Path.home() / ".cache" / "shadow-reader"}.get(
            disk.lower(), Path(disk).expanduser().absolute())
        grid = int(_num(env, "GRID", 512, int))
        return cls(model=_get(env, "MODEL") or "", device=_get(env, "DEVICE") or "",
                   state_dir=state_dir, resident_gb=_num(env, "GB", 4.0),
                   grid=grid, disk_dir=disk_dir, disk_gb=_num(env, "DISK_GB", None),
                   disk_ttl_h=_num(env, "DISK_TTL_H", 48.0),
                   disk_shared=_flag(env, "DISK_SHARED"),
                   disk_grace_s=_num(env, "DISK_GRACE_S", None),
                   prefetch_gb=_num(env, "PREFETCH_GB", None),
                   api_key=_get(env, "API_KEY"),
                   max_body_bytes=int(_num(env, "MAX_BODY_MB", 64.0) * 2**20),
                   profiles_path=Path(_get(env, "PROFILES")) if _get(env, "PROFILES") else None,
                   history_every_s=_num(env, "HISTORY_S", 1.0),
                   history_samples=int(_num(env, "HISTORY_SAMPLES", 3600, int)),
                   ask_workers=_num(env, "ASK_WORKERS", 2, int),
                   ask_queue=_num(env, "ASK_QUEUE", 32, int),
                   ask_max_catchup_tokens=_catchup(env),
                   max_question_tokens=_num(env, "MAX_QUESTION_TOKENS", 32_768, int),
                   max_summary_tokens=_num(env, "MAX_SUMMARY_TOKENS", 4096, int),
                   max_questions=_num(env, "MAX_QUESTIONS", 8, int),
                   max_positions_policy=(_get(env, "MAX_POSITIONS_POLICY") or "refuse").strip(),
                   threads=_num(env, "THREADS", None, int),
                   attention=(_get(env, "ATTENTION") or "").strip().lower() or None,
                   metrics_sessions=_num(env, "METRICS_SESSIONS", MAX_SESSION_SERIES, int),
                   max_tails=_num(env, "TAILS", 8, int),
                   scheduler=SchedulerConfig.from_env(env, grid=grid))

    def with_overrides(self, **kw) -> "ServiceConfig":
        """A copy with the CLI flags that were given (None values are ignored)."""
        kw = {k: v for k, v in kw.items() if v is not None}
        if "grid" in kw:
            kw["scheduler"] = replace(self.scheduler, grid=kw["grid"])
        return replace(self, **kw)
