"""The counters over time, for the dashboard (GET /v1/shadow/history): every `every_s` a sample
of what /metrics exports (the same Prometheus names and labels, read through the same
collector, server.metrics.Collector), kept in a bounded ring, so a page opened or reloaded
later still draws rates over the last minutes.

A sample is {"t": unix time in s, "values": {"name{label=\"v\"}": value}}: counters with their
`_total` suffix, gauges, the question-latency histogram's `_sum` and `_count` (no buckets), and
the backlog of at most MAX_BACKLOG_SERIES sessions (the largest), so a sample's size does not
grow with the number of sessions.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque

log = logging.getLogger(__name__)
MAX_BACKLOG_SERIES = 32
BACKLOG = "shadow_backlog_ids"


def sample_key(name: str, labels: dict[str, str]) -> str:
    """'shadow_pages', {'state': 'pinned'} -> 'shadow_pages{state="pinned"}' (as /metrics
    writes a sample, labels in the family's order)."""
    if not labels:
        return name
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


def flatten(collector) -> dict[str, float] | None:
    """The collector's samples as {key: value} (module doc), None while it reports nothing
    (the model loads)."""
    out, backlog = {}, []
    for family in collector.collect():
        for s in family.samples:
            if s.name.endswith(("_bucket", "_created")):
                continue
            if s.name == BACKLOG:
                backlog.append((s.value, s.labels.get("session", "")))
                continue
            out[sample_key(s.name, s.labels)] = float(s.value)
    if not out and not backlog:
        return None
    for value, sid in sorted(backlog, reverse=True)[:MAX_BACKLOG_SERIES]:
        out[sample_key(BACKLOG, {"session": sid})] = float(value)
    return out


class History:
    """A bounded ring of samples (at most `max_samples`, the oldest dropped), thread-safe: a
    sampler adds while routes read.

    Args: every_s: the sampling interval the sampler uses (s), reported to readers;
    max_samples: the ring's size (3,600 at 1 s: an hour)."""

    def __init__(self, every_s: float = 1.0, max_samples: int = 3600):
        if every_s <= 0 or max_samples < 1:
            raise ValueError(f"history: every_s must be > 0 and max_samples >= 1, got "
                             f"{every_s} and {max_samples}")
        self.every_s, self.max_samples = every_s, max_samples
        self._ring: deque = deque(maxlen=max_samples)
        self._lock = threading.Lock()

    def add(self, values: dict[str, float] | None, t: float | None = None) -> None:
        """Append a sample taken at `t` (unix s, default now); None (nothing to report) is
        skipped."""
        if values is None:
            return
        with self._lock:
            self._ring.append({"t": time.time() if t is None else t, "values": values})

    def since(self, t: float = 0.0) -> list[dict]:
        """The samples taken after `t` (unix s), oldest first."""
        with self._lock:
            return [s for s in self._ring if s["t"] > t]

    def answer(self, since: float = 0.0) -> dict:
        """The history route's body: {now, every_s, max_samples, samples}."""
        return {"now": time.time(), "every_s": self.every_s, "max_samples": self.max_samples,
                "samples": self.since(since)}


class Sampler:
    """A daemon thread adding flatten(collector) to `history` every history.every_s until
    `stop`. A failing collection is logged once and sampling goes on."""

    def __init__(self, history: History, collector):
        self.history, self.collector = history, collector
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shadow-history", daemon=True)
        self._failed = False

    def start(self) -> None:
        if self._thread.ident is None:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(5.0)

    def sample(self) -> None:
        """One sample now (the thread's step; tests call it directly)."""
        try:
            self.history.add(flatten(self.collector))
        except Exception:                      # a sample lost, never the service
            if not self._failed:
                log.exception("history: a sample failed (logged once)")
                self._failed = True

    def _run(self) -> None:
        while not self._stop.wait(self.history.every_s):
            self.sample()
