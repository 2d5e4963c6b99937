"""Prometheus metrics, read at scrape time from a source: the facade's metrics (under the one
lock) in the standalone service, or the last ones fetched from vLLM's worker by the endpoint
plugin."""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily


class Collector:
    """A prometheus_client collector over `source()`: facade.Shadow.metrics's dict, or None
    (nothing to report yet: the model loads)."""

    def __init__(self, source):
        self.source = source

    def collect(self):
        stats = self.source()
        if stats is None:
            return
        t = stats["totals"]
        yield CounterMetricFamily("shadow_read_tokens", "ids read into committed state",
                                  t["num_read_tokens"])
        yield CounterMetricFamily("shadow_chunks_read", "grid chunks read", t["num_chunks"])
        yield CounterMetricFamily("shadow_read_ms", "ms spent reading", t["read_ms"])
        backlog = GaugeMetricFamily("shadow_backlog_ids", "ids not read yet", labels=["session"])
        for sid, s in stats["sessions"].items():
            backlog.add_metric([sid[:128]], s["backlog"])
        yield backlog
        for key in ("spills", "restores", "refusals", "drops"):
            yield CounterMetricFamily(f"shadow_{key}", f"sessions {key}", stats[key])
        yield GaugeMetricFamily("shadow_resident_bytes", "resident session bytes",
                                stats["resident_bytes"])
        ration_ms, decode_ms = stats["ration_ms"], stats["host_decode_ms"]
        yield CounterMetricFamily("shadow_ration_ms", "ms the in-turn ration used", ration_ms)
        yield CounterMetricFamily("shadow_host_decode_ms", "ms of host decode (first token to "
                                  "turn end) the ration was earned over", decode_ms)
        yield GaugeMetricFamily("shadow_host_share", "ration ms over host decode ms",
                                ration_ms / decode_ms if decode_ms > 0 else 0.0)
        starts = CounterMetricFamily("shadow_turn_starts", "turns begun, fresh (backlog below a "
                                     "chunk) or not", labels=["fresh"])
        for fresh, n in stats["turn_starts"].items():
            starts.add_metric([fresh], n)
        yield starts
        q = stats["question_ms"]
        buckets = [("+Inf" if b == float("inf") else str(b), n) for b, n in q["buckets"]]
        yield HistogramMetricFamily("shadow_question_ms", "question latency (ms)",
                                    buckets=buckets, sum_value=q["sum"])
