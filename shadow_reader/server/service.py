"""The service behind the HTTP routes: model loading in the background, the reader and its host
interface, the busy signal, prometheus metrics, recent answers."""
from __future__ import annotations

import dataclasses

import logging
import threading
import time
from collections import deque
from pathlib import Path

import torch
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from ..config import ServiceConfig
from ..host import Host
from ..model import load_model
from ..model.config import PRESETS
from ..reader import Reader
from ..step import ReaderConfig
from ..tokenizer import load_tokenizer
from .narrator import Narrator
from .router_journal import Profile, RouterJournal, insertion_point, load_profiles

log = logging.getLogger(__name__)
ASK_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, float("inf"))


def check_config(cfg: ServiceConfig) -> None:
    """What can be refused before the service starts (ValueError naming the setting): an empty
    or unknown model, a grid the reader cannot take. A model that fails later while loading is
    reported by /healthz (503) instead."""
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


class NotReady(Exception):
    """The model is still loading (or failed to load): the route answers 503."""


class Service:
    """Holds the reader once loaded; `state` is "loading", "ready" or "failed"."""

    def __init__(self, cfg: ServiceConfig):
        check_config(cfg)
        self.cfg = cfg
        self.profiles = load_profiles(cfg.profiles_path)
        self.journal = RouterJournal(cfg.state_dir / "shadow.jsonl")
        self.narrator = Narrator()
        self.session_profiles: dict[str, Profile] = {}
        self.state, self.error, self.loaded_s = "loading", None, None
        self.stage, self.warm_up_s = "loading the model", None
        self.reader: Reader | None = None
        self.host: Host | None = None
        self.tokenizer = None
        self.busy = False                     # the host's own signal (POST /v1/shadow/host)
        self.answers: deque = deque(maxlen=20)
        self.ask_ms: deque = deque(maxlen=10_000)      # for the latency histogram
        self.registry = CollectorRegistry()
        self.registry.register(_Collector(self))
        self._thread = threading.Thread(target=self._load, name="shadow-load", daemon=True)

    def start(self) -> None:
        """Start loading the model (once; a second start, e.g. a second lifespan, is a no-op)."""
        if self._thread.ident is None:
            self._thread.start()

    def _load(self) -> None:
        t0 = time.perf_counter()
        try:
            cfg = self.cfg
            device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
            model = load_model(cfg.model, device=device)
            self.tokenizer = load_tokenizer(None if cfg.model.startswith("random:") else cfg.model)
            disk_bytes = int(cfg.disk_gb * 2**30) if cfg.disk_gb else None
            self.reader = Reader(model, grid=cfg.grid, tokenizer=self.tokenizer,
                                 resident_bytes=int(cfg.resident_gb * 2**30),
                                 disk_dir=cfg.disk_dir, disk_bytes=disk_bytes)
            self.stage = "compiling and capturing CUDA graphs"    # not inside a host's round
            self.warm_up_s = self.reader.warm_up()
            self.host = Host(self.reader, host_busy=lambda: self.busy, cfg=cfg.scheduler,
                             on_question=lambda s, at: self.journal.answer(self.reader, s, at),
                             idle_hook=lambda: self.narrator.run_one(self.reader))
            self.host.start_idle_loop()
            self.state, self.loaded_s, self.stage = "ready", time.perf_counter() - t0, "ready"
        except Exception as e:                # reported by /healthz and status, not raised
            log.exception("model load failed")
            self.state, self.error = "failed", f"{type(e).__name__}: {e}"

    def turn(self, session: str, ids: list[int], profile: str | None, router_label: str | None):
        """A new turn under its profile: None when the profile's mode is off (not followed);
        registers the router question at the insertion point when the profile asks for it.
        Raises ValueError for an unknown profile."""
        host = self.require()
        if profile is not None and profile not in self.profiles:
            raise ValueError(f"unknown profile {profile!r}")
        prof = self.profiles.get(profile, Profile())
        if not prof.mode:
            return None
        with host.lock:
            known = session in self.reader.sessions()
            backlog = self.reader.backlog(session) if known else 0
            result = host.turn_started(session, ids, profile, router_label)
            self.session_profiles[session] = prof
            self.narrator.turn_started(session)
            if prof.router and len(ids) >= prof.router_min_tokens:
                at = insertion_point(ids)
                self.journal.expect(session, at, router_label, backlog)
                host.question_at(session, at)
        return result

    def output(self, session: str, ids: list[int]):
        """Ids the host produced; queues a narration at each </think> when the profile asks."""
        host = self.require()
        with host.lock:
            start = len(self.reader.ids(session))
            result = host.output(session, ids)
            if self.session_profiles.get(session, Profile()).narrator:
                self.narrator.on_output(session, start, list(ids))
        return result

    def between_rounds(self, session: str):
        """The ration slice, then one narration if the narrator's share covers its cost."""
        host = self.require()
        sl = host.between_rounds(session)
        with host.lock:
            turn = host.scheduler.turns.get(session)
            first = turn.first_token_s if turn else None
            budget = self.narrator.budget_ms(session, first, host.scheduler.clock())
            if budget >= self.narrator.estimate_ms():
                self.narrator.run_one(self.reader, session)
        return sl

    def catch_up(self, session: str, at: int) -> int:
        """Read the chunks a question or fork at `at` needs one at a time, taking the reader's
        lock for each, so a host's call waits at most one chunk (the ask itself would read them
        all under one hold): at or above C, commit up to the grid line at or below `at`; below
        C, re-read in scratch from the newest checkpoint (Reader.prepare_fork). Returns the
        chunks read."""
        line, done = at // self.cfg.grid * self.cfg.grid, 0
        for _ in range(2 * line // self.cfg.grid + 2):   # bounded: another call may restart it
            with self.host.lock:
                r = self.reader
                if session not in r.sessions():
                    return done
                if at < r.committed(session):
                    n = r.prepare_fork(session, at, 1)
                elif r.committed(session) < line and r.backlog(session) >= self.cfg.grid:
                    n = r.read(session, max_chunks=1).num_chunks
                else:
                    n = 0
                if n == 0:
                    return done
                done += n
        return done

    def require(self) -> Host:
        if self.state != "ready":
            raise NotReady(self.error or "the model is loading")
        return self.host

    def close(self) -> None:
        """A planned stop: let a load in progress finish (a process that exits while the
        loading thread is inside torch aborts), stop the idle loop, then park every resident
        session."""
        if self._thread.ident is not None:
            self._thread.join()
        if self.host is not None:
            self.host.stop_idle_loop()
            with self.host.lock:
                self.reader.close()

    def record_answer(self, session: str, answer) -> None:
        self.ask_ms.append(answer.ms)
        self.answers.append({"session": session, "label": answer.label,
                             "p": max(answer.probs), "ms": round(answer.ms, 2),
                             "at": answer.at, "time": time.time()})

    def status(self) -> dict:
        out = {"state": self.state, "stage": self.stage, "error": self.error,
               "model": self.cfg.model, "warm_up_s": self.warm_up_s,
               "grid": self.cfg.grid, "host_busy": self.busy,
               "last_answers": list(self.answers),
               "router_agreement": {"agree": self.journal.agree, "total": self.journal.total},
               "narrations": {s: list(v)[-3:] for s, v in self.narrator.narrations.items()},
               "narrator_jobs_pending": len(self.narrator.jobs),
               "open_turns": sorted(self.host.scheduler.turns.copy()) if self.host else [],
               "scheduler": dataclasses.asdict(self.cfg.scheduler)}       # settings in effect
        if self.state == "ready":
            m = self.reader.model
            with self.host.lock:
                stats = self.reader.stats()
            out.update({"fingerprint": m.info.fingerprint, "random_weights": m.info.is_random,
                        "device": str(m.device), "dtype": str(m.dtype).removeprefix("torch."),
                        "load_s": round(self.loaded_s, 2), "totals": dict(self.reader.totals),
                        **stats})
        return out


class _Collector:
    """Prometheus metrics read from the service at scrape time."""

    def __init__(self, svc: Service):
        self.svc = svc

    def collect(self):
        svc = self.svc
        if svc.state != "ready":
            return
        t = svc.reader.totals
        yield CounterMetricFamily("shadow_ids_read", "ids committed by reads", t["num_read_tokens"])
        yield CounterMetricFamily("shadow_chunks_read", "grid chunks read", t["num_chunks"])
        yield CounterMetricFamily("shadow_read_ms", "ms spent reading", t["read_ms"])
        with svc.host.lock:
            stats = svc.reader.stats()
        backlog = GaugeMetricFamily("shadow_backlog_ids", "ids not read yet", labels=["session"])
        for sid, s in stats["sessions"].items():
            backlog.add_metric([sid[:128]], s["backlog"])
        yield backlog
        for key in ("spills", "restores", "refusals", "drops"):
            yield CounterMetricFamily(f"shadow_{key}", f"sessions {key}", stats[key])
        yield GaugeMetricFamily("shadow_resident_bytes", "resident session bytes",
                                stats["resident_bytes"])
        with svc.host.lock:
            ration_ms, decode_ms = svc.host.scheduler.host_share()
        yield CounterMetricFamily("shadow_ration_ms", "ms the in-turn ration used", ration_ms)
        yield CounterMetricFamily("shadow_host_decode_ms", "ms of host decode (first token to "
                                  "turn end) the ration was earned over", decode_ms)
        yield GaugeMetricFamily("shadow_host_share", "ration ms over host decode ms",
                                ration_ms / decode_ms if decode_ms > 0 else 0.0)
        ms = list(svc.ask_ms)
        buckets = [("+Inf" if b == float("inf") else str(b), sum(x <= b for x in ms))
                   for b in ASK_BUCKETS_MS]
        yield HistogramMetricFamily("shadow_question_ms", "question latency (ms)",
                                    buckets=buckets, sum_value=sum(ms))
