"""The service behind the HTTP routes: model loading in the background, the reader, its host
interface and the facade every route goes through (facade.Shadow: the one lock), the busy
signal, status."""
from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import torch
from prometheus_client import CollectorRegistry

from adapters import PRESETS, load_model
from adapters.runners.graphs import ATTENTIONS
from shadow_plugin.chat.tokenizer import load_tokenizer
from shadow_plugin.reader.reader import Reader
from shadow_plugin.reader.step import ReaderConfig
from shadow_plugin.scheduling.host import Host
from shadow_plugin.server.config import MAX_QUESTIONS, ServiceConfig, default_threads
from shadow_plugin.server.errors import NotReady
from shadow_plugin.server.facade import Shadow, narration_status
from shadow_plugin.server.history import EVERY_S_RANGE, MAX_SAMPLES, History, Sampler
from shadow_plugin.server.metrics import Collector
from shadow_plugin.server.narrator import Narrator
from shadow_plugin.server.router_journal import RouterJournal, load_profiles
from shadow_plugin.server.startup import check_paths

log = logging.getLogger(__name__)
MAX_METRICS_SESSIONS = 10_000  # sessions with series of their own a setting may ask for
# SHADOW_ATTENTION's values: the runners' attentions their CUDA graphs take ('sdpa' is eager
# only: runners.graphs.ChunkGraphs refuses it on CUDA, and the CPU reads eagerly anyway)
GRAPH_ATTENTIONS = tuple(a for a in ATTENTIONS if a != "sdpa")


def check_config(cfg: ServiceConfig) -> None:
    """What can be refused before the service starts (ValueError naming the setting): an empty
    or unknown model, a grid the reader cannot take, a history the dashboard cannot keep, a
    number of sessions with series of their own out of range, a negative number of tails. A
    model that fails later while loading is reported by /healthz (503) instead."""
    if not cfg.model:
        raise ValueError("SHADOW_MODEL is empty: set it to a Qwen3.5 model directory or "
                         "random:NAME (or pass --model)")
    if cfg.model.startswith("random:"):
        name = cfg.model.removeprefix("random:")
        if name not in PRESETS:
            raise ValueError(f"SHADOW_MODEL {cfg.model!r}: no such preset (random:"
                             f"{', random:'.join(PRESETS)})")
    elif not Path(cfg.model).expanduser().is_dir():
        raise ValueError(f"SHADOW_MODEL {cfg.model!r} is not a directory (a Qwen3.5 model "
                         "directory or random:NAME)")
    try:
        ReaderConfig(grid=cfg.grid)
    except ValueError as e:
        raise ValueError(f"SHADOW_GRID / --grid: {e}") from None
    lo, hi = EVERY_S_RANGE
    if not lo <= cfg.history_every_s <= hi:
        raise ValueError(f"SHADOW_HISTORY_S={cfg.history_every_s}: the dashboard's sampling "
                         f"interval must be within [{lo}, {hi}] s")
    if not 1 <= cfg.history_samples <= MAX_SAMPLES:
        raise ValueError(f"SHADOW_HISTORY_SAMPLES={cfg.history_samples}: keep 1 to "
                         f"{MAX_SAMPLES} samples")
    if not 0 <= cfg.metrics_sessions <= MAX_METRICS_SESSIONS:
        raise ValueError(f"SHADOW_METRICS_SESSIONS={cfg.metrics_sessions}: 0 to "
                         f"{MAX_METRICS_SESSIONS} sessions with series of their own")
    if cfg.max_tails < 0:
        raise ValueError(f"SHADOW_TAILS={cfg.max_tails}: the questions' tails kept, 0 (none) "
                         f"or more")
    check_limits(cfg)
    check_paths(cfg)


def check_limits(cfg: ServiceConfig) -> None:
    """The question pool, the catch-up bound, the question and summary limits, the positions
    policy, the threads and the attention (ValueError naming the variable; an attention the
    GPU cannot run, fa4 off Hopper, fails the load instead: /healthz)."""
    if not 1 <= cfg.ask_workers <= 256:
        raise ValueError(f"SHADOW_ASK_WORKERS={cfg.ask_workers}: 1 to 256 questions at once")
    if not 0 <= cfg.ask_queue <= 100_000:
        raise ValueError(f"SHADOW_ASK_QUEUE={cfg.ask_queue}: 0 to 100,000")
    if cfg.ask_max_catchup_tokens is not None and cfg.ask_max_catchup_tokens < 1:
        raise ValueError(f"SHADOW_ASK_MAX_CATCHUP_TOKENS={cfg.ask_max_catchup_tokens}: must be "
                         "at least 1 (or none for no bound)")
    for var, value in (("SHADOW_MAX_QUESTION_TOKENS", cfg.max_question_tokens),
                       ("SHADOW_MAX_SUMMARY_TOKENS", cfg.max_summary_tokens)):
        if not 1 <= value <= 2**20:
            raise ValueError(f"{var}={value}: 1 to {2**20:,} ids")
    if not 1 <= cfg.max_questions <= MAX_QUESTIONS:
        raise ValueError(f"SHADOW_MAX_QUESTIONS={cfg.max_questions}: 1 to {MAX_QUESTIONS} "
                         "questions in one ask")
    if cfg.max_positions_policy not in ("refuse", "cap"):
        raise ValueError(f"SHADOW_MAX_POSITIONS_POLICY={cfg.max_positions_policy!r}: refuse "
                         "or cap")
    if cfg.threads is not None and cfg.threads < 1:
        raise ValueError(f"SHADOW_THREADS / --threads={cfg.threads}: at least 1")
    if cfg.attention not in (None, *GRAPH_ATTENTIONS):
        raise ValueError(f"SHADOW_ATTENTION={cfg.attention!r}: one of "
                         f"{', '.join(GRAPH_ATTENTIONS)} (the CUDA runners'; sdpa is the CPU's "
                         "eager read, which the runners' graphs cannot take), or unset for the "
                         "device's default")
    if cfg.attention is not None and (cfg.device or ("cuda" if torch.cuda.is_available()
                                                     else "cpu")) == "cpu":
        raise ValueError(f"SHADOW_ATTENTION={cfg.attention!r} chooses the CUDA runners' "
                         "attention; on the CPU the reader reads through SDPA: leave it unset")


class Service:
    """Holds the reader once loaded; `state` is "loading", "ready" or "failed". Routes reach
    the reader only through `require()`, the facade. gc_ms: the process's garbage
    collections' clock (ms) the reader counts its reads' collections by (Reader's gc_ms;
    an engine's GcPauses.total_ms), None for none."""

    def __init__(self, cfg: ServiceConfig, gc_ms: Callable[[], float] | None = None):
        check_config(cfg)
        self.cfg = cfg
        self.gc_ms = gc_ms                    # the process's collections, for the reader
        self.profiles = load_profiles(cfg.profiles_path)      # ValueError naming the file
        self.journal = RouterJournal(cfg.state_dir / "shadow.jsonl")
        self.narrator = Narrator()
        self.state, self.error, self.loaded_s = "loading", None, None
        self.stage, self.warm_up_s = "loading the model", None
        self.reader: Reader | None = None
        self.host: Host | None = None
        self.shadow: Shadow | None = None
        self.tokenizer = None
        self._busy = False                    # the host's own signal (POST /v1/shadow/host)
        self.busy_since: float | None = None  # when it last said busy (s since the epoch)
        self.stop_write_errors = 0            # files the planned stop failed to write
        self.registry = CollectorRegistry()
        self._metrics_taken: tuple[float, dict] | None = None   # (monotonic s, metrics)
        collector = Collector(self._metrics, cfg.metrics_sessions)
        self.registry.register(collector)
        self.history = History(cfg.history_every_s, cfg.history_samples)
        self.sampler = Sampler(self.history, collector,    # samples once the model is ready
                               prepare=lambda: self.state == "ready" and
                               self.reader.refresh_disk_listing())
        self._thread = threading.Thread(target=self._load, name="shadow-load", daemon=True)

    def _metrics(self) -> dict | None:
        """Shadow.metrics when ready (None before), kept with its time for metrics_snapshot."""
        if self.state != "ready":
            return None
        out = self.shadow.metrics()
        self._metrics_taken = (time.monotonic(), out)
        return out

    def metrics_snapshot(self, max_age_s: float) -> dict | None:
        """The metrics the last collection took (the history's sampler takes them every
        history_every_s in its own thread), if at most max_age_s (s) old, else None: what an
        engine's thread can hand out without taking the shadow's lock or building the stats
        itself (shadow_plugin.engine.embedded)."""
        taken = self._metrics_taken
        if taken is None or time.monotonic() - taken[0] > max_age_s:
            return None
        return taken[1]

    def start(self) -> None:
        """Start loading the model (once; a second start, e.g. a second lifespan, is a no-op)."""
        if self._thread.ident is None:
            self._thread.start()
            self.sampler.start()

    def _load(self) -> None:
        t0 = time.perf_counter()
        try:
            cfg = self.cfg
            device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
            torch.set_num_threads(cfg.threads or default_threads())
            model = load_model(cfg.model, device=device)
            self.tokenizer = load_tokenizer(None if cfg.model.startswith("random:") else cfg.model)
            disk_bytes = int(cfg.disk_gb * 2**30) if cfg.disk_gb else None
            # not inside a host's round; on CUDA the reader's construction already warms its
            # chunk runner up (its kernel picks are part of the page keys' identity)
            self.stage = "compiling and capturing CUDA graphs"
            t_warm = time.perf_counter()
            self.reader = Reader(model, grid=cfg.grid, tokenizer=self.tokenizer,
                                 resident_bytes=int(cfg.resident_gb * 2**30),
                                 disk_dir=cfg.disk_dir, disk_bytes=disk_bytes,
                                 disk_ttl_s=cfg.disk_ttl_h * 3600,
                                 disk_shared=cfg.disk_shared, disk_grace_s=cfg.disk_grace_s,
                                 prefetch_bytes=None if cfg.prefetch_gb is None else
                                 int(cfg.prefetch_gb * 2**30),
                                 attention=cfg.attention, max_tails=cfg.max_tails,
                                 gc_ms=self.gc_ms)
            self.reader.adapter.bind_thread()
            self.reader.warm_up(batch_sessions=cfg.scheduler.batch_sessions)
            self.warm_up_s = time.perf_counter() - t_warm
            self.host = Host(self.reader, host_busy=lambda: self.busy, cfg=cfg.scheduler,
                             on_question=lambda s, at: self.journal.answer(self.reader, s, at),
                             idle_hook=lambda: self.narrator.run_one(self.reader))
            self.shadow = Shadow(self.host, self.journal, self.narrator, self.profiles,
                                 cfg.ask_max_catchup_tokens, cfg.max_positions_policy,
                                 cfg.max_question_tokens, cfg.max_summary_tokens,
                                 max_questions=cfg.max_questions)
            self.host.start_idle_loop()
            self.state, self.loaded_s, self.stage = "ready", time.perf_counter() - t0, "ready"
        except Exception as e:                # reported by /healthz and status, not raised
            log.exception("model load failed")
            self.state, self.error = "failed", f"{type(e).__name__}: {e}"

    def wait_loaded(self, timeout_s: float | None = None) -> str:
        """Wait for the model's load to end (started by `start`); returns the state."""
        if self._thread.ident is not None:
            self._thread.join(timeout_s)
        return self.state

    def require(self) -> Shadow:
        """The facade; NotReady (503) while the model loads or after it failed to."""
        if self.state != "ready":
            if self.state == "failed":
                raise NotReady(f"the model failed to load: {self.error}; fix the "
                               "configuration and restart the service", True)
            raise NotReady("the model is loading")
        return self.shadow

    def close(self) -> None:
        """A planned stop: let a load in progress finish (a process that exits while the
        loading thread is inside torch aborts), stop the idle loop, then park every resident
        session (stop_write_errors: the writes of it that failed)."""
        if self._thread.ident is not None:
            self._thread.join()
        self.sampler.stop()
        if self.host is not None:
            self.host.stop_idle_loop()
            with self.host.lock:
                resident = self.reader.num_resident
                errors_before = self.reader.stats()["write_errors"]
                self.reader.close()
                self.stop_write_errors = self.reader.stats()["write_errors"] - errors_before
            where = (f"written to {self.cfg.disk_dir}" if self.cfg.disk_dir else
                     "dropped (SHADOW_DISK is off: a restart will not know them)")
            noun = "session" if resident == 1 else "sessions"
            print(f"shadow-reader: stopped: {resident} resident {noun} {where}; "
                  f"{self.reader.stats()['write_errors']} write errors", file=sys.stderr,
                  flush=True)

    @property
    def busy(self) -> bool:
        """The host's own busy signal (POST /v1/shadow/host, or the engine's steps)."""
        return self._busy

    @busy.setter
    def busy(self, value: bool) -> None:
        if value and not self._busy:
            self.busy_since = time.time()
        elif not value:
            self.busy_since = None
        self._busy = bool(value)

    def status(self) -> dict:
        """The service's state and settings; once ready, the reader's stats, totals, open turns,
        router agreement and narrations, read under the one lock (Shadow.stats)."""
        ready = self.state == "ready"
        stats = self.shadow.stats() if ready else {
            **narration_status(self.narrator, self.journal), "open_turns": [],  # no idle loop
            "last_answers": []}
        out = {"state": self.state, "stage": self.stage, "error": self.error,
               "model": self.cfg.model, "warm_up_s": self.warm_up_s,
               "grid": self.cfg.grid, "host_busy": self.busy,
               "host_busy_since": self.busy_since,
               "scheduler": dataclasses.asdict(self.cfg.scheduler)}       # settings in effect
        if ready:
            for key in ("ration_ms", "host_decode_ms"):
                stats.pop(key)
            info, spec = self.reader.adapter.info, self.reader.adapter.spec
            out.update({"fingerprint": info.fingerprint, "random_weights": info.is_random,
                        "device": str(spec.device),
                        "dtype": str(spec.dtype).removeprefix("torch."),
                        "read_path": self.reader.adapter.path,
                        "load_s": round(self.loaded_s, 2)})
        out.update(stats)
        return out
