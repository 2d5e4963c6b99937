"""The counters over time, for the dashboard (GET /v1/shadow/history): every `every_s` a sample
of what /metrics exports (the same Prometheus names and labels, read through the same
collector, server.metrics.Collector), kept in a bounded ring, so a page opened or reloaded
later still draws rates over the last minutes.

A sample is {"seq": its number in this process (from 1), "t": unix time in s, "values":
{"name{label=\"v\"}": value}}: counters with their
`_total` suffix, gauges, the question-latency histogram's `_sum` and `_count` (no buckets), and
the backlog of at most MAX_BACKLOG_SERIES sessions (the largest), so a sample's size does not
grow with the number of sessions. The sessions' warmth (`shadow_session_*`) and the server's
name (`shadow_server_info`), for routers and Prometheus, are not sampled: the dashboard draws
neither, and they would multiply a sample's size.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque

log = logging.getLogger(__name__)
MAX_BACKLOG_SERIES = 32        # sessions whose backlog a sample keeps (the largest): its size
BACKLOG = "shadow_backlog_ids"
NOT_SAMPLED = ("shadow_session_", "shadow_server_info")   # for routers, not the dashboard
EVERY_S_RANGE = (0.1, 3600.0)  # the sampling intervals a history takes (s)
MAX_SAMPLES = 86_400           # the largest ring a history takes (a day at 1 s)
STOP_JOIN_S = 5.0              # how long a stop waits for a sample in progress


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
            if s.name.endswith(("_bucket", "_created")) or s.name.startswith(NOT_SAMPLED):
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
    sampler adds while routes read. `started` (unix s) names this process's history: a reader
    that sees it change knows the counters started again.

    Args: every_s: the sampling interval the sampler uses (s, within EVERY_S_RANGE), reported
    to readers; max_samples: the ring's size (1 to MAX_SAMPLES; 3,600 at 1 s: an hour).
    Raises ValueError outside those ranges."""

    def __init__(self, every_s: float = 1.0, max_samples: int = 3600):
        lo, hi = EVERY_S_RANGE
        if not lo <= every_s <= hi or not 1 <= max_samples <= MAX_SAMPLES:
            raise ValueError(f"history: every_s must be within [{lo}, {hi}] s and max_samples "
                             f"within [1, {MAX_SAMPLES}], got {every_s} and {max_samples}")
        self.every_s, self.max_samples = every_s, max_samples
        self.started = time.time()
        self._ring: deque = deque(maxlen=max_samples)
        self._seq = 0
        self._lock = threading.Lock()

    def add(self, values: dict[str, float] | None, t: float | None = None) -> None:
        """Append a sample taken at `t` (unix s, default now); None (nothing to report) is
        skipped."""
        if values is None:
            return
        with self._lock:
            self._seq += 1
            self._ring.append({"seq": self._seq, "t": time.time() if t is None else t,
                               "values": values})

    def since(self, t: float = 0.0, after: int = 0) -> list[dict]:
        """The samples taken after `t` (unix s) and numbered after `after`, oldest first (a
        reader that follows `seq` is not fooled by a clock set back)."""
        with self._lock:
            return [s for s in self._ring if s["t"] > t and s["seq"] > after]

    def answer(self, since: float = 0.0, after: int = 0, window_s: float | None = None) -> dict:
        """The history route's body: {now, started, every_s, max_samples, samples} with the
        samples after `since` and `after`, and within the last `window_s` s when given."""
        now = time.time()
        t = since if window_s is None else max(since, now - window_s)
        return {"now": now, "started": self.started, "every_s": self.every_s,
                "max_samples": self.max_samples, "samples": self.since(t, after)}


class Sampler:
    """A daemon thread adding flatten(collector) to `history` every history.every_s until
    `stop`, after `prepare()` (work that need not hold what the collection holds: the disk
    folder's listing, outside the service's lock). A failing collection is logged once and
    sampling goes on."""

    def __init__(self, history: History, collector, prepare=None):
        self.history, self.collector, self.prepare = history, collector, prepare
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shadow-history", daemon=True)
        self._failed = False

    def start(self) -> None:
        """Start the thread (once)."""
        if self._thread.ident is None:
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread, waiting at most STOP_JOIN_S for a sample in progress."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(STOP_JOIN_S)

    def sample(self) -> None:
        """One sample now (the thread's step; tests call it directly)."""
        try:
            if self.prepare is not None:
                self.prepare()
            self.history.add(flatten(self.collector))
        except Exception:                      # a sample lost, never the service
            if not self._failed:
                log.exception("history: a sample failed (logged once)")
                self._failed = True

    def _run(self) -> None:
        while not self._stop.wait(self.history.every_s):
            self.sample()
