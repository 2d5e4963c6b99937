"""Prometheus metrics, read at scrape time from a source: the facade's metrics (under the one
lock) in the standalone service, or the last ones fetched from vLLM's worker by the endpoint
plugin.

Series labelled by session are bounded (Prometheus keeps every label value it ever saw as a
series of its own, and a server that follows agents sees thousands of session ids over a
day): `shadow_session_*` (a session's warmth, block_store.warmth: what a router scores) only
for the `max_session_series` warmest sessions (most ids resumed from memory, then from memory
and disk, then the most ids), `shadow_backlog_ids` only for the `max_session_series` largest
backlogs, and `shadow_session_series_omitted` counts the sessions left out. Every session's
figures are in the status route's `sessions` (GET /v1/shadow/status, /v1/shadow/sessions),
which has no such cost.
"""
from __future__ import annotations

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)

MAX_SESSION_SERIES = 32       # sessions with series of their own (SHADOW_METRICS_SESSIONS)


class Collector:
    """A prometheus_client collector over `source()`: facade.Shadow.metrics's dict, or None
    (nothing to report yet: the model loads). max_session_series: how many sessions get
    series of their own (module doc; 0: none). Raises ValueError for a negative one."""

    def __init__(self, source, max_session_series: int = MAX_SESSION_SERIES):
        if max_session_series < 0:
            raise ValueError(f"max_session_series must be >= 0, got {max_session_series}")
        self.source, self.max_session_series = source, max_session_series

    def collect(self):
        stats = self.source()
        if stats is None:
            return
        t = stats["totals"]
        yield CounterMetricFamily("shadow_read_tokens", "ids read into committed state",
                                  stats["read_tokens"])
        yield from _page_metrics(stats)
        yield CounterMetricFamily("shadow_chunks_read", "grid chunks read", t["num_chunks"])
        yield CounterMetricFamily("shadow_read_ms", "ms spent reading", t["read_ms"])
        yield CounterMetricFamily("shadow_batched_forwards", "forwards that read chunks of two "
                                  "or more sessions at once (SHADOW_BATCH_SESSIONS)",
                                  t.get("num_batched_forwards", 0))
        yield CounterMetricFamily("shadow_batched_chunks", "chunks read in those forwards",
                                  t.get("num_batched_chunks", 0))
        yield from session_metrics(stats, self.max_session_series)
        if "answer_replies" in stats:      # vLLM's endpoint (server.result_box)
            replies = CounterMetricFamily("shadow_answer_replies", "questions' replies that "
                                          "reached the endpoint pushed by the worker, or "
                                          "fetched by a look", labels=["path"])
            for path, n in sorted(stats["answer_replies"].items()):
                replies.add_metric([path], n)
            yield replies
        for key, doc in (("spills", "sessions parked with their files written"),
                         ("restores", "sessions brought back"),
                         ("drops", "sessions parked without files (no disk, or the write "
                                   "failed)"),
                         ("refusals", "files refused as not fitting, set aside or listed under "
                                      "refused_sessions (this process)"),
                         ("deleted_files", "files the disk's TTL or cap deleted"),
                         ("write_errors", "disk writes that failed")):
            yield CounterMetricFamily(f"shadow_{key}", doc, stats[key])
        yield CounterMetricFamily("shadow_restore_ms", "ms the restores took (a manifest read, "
                                  "pages and states found in memory or loaded from disk)",
                                  stats["restore_ms"])
        yield GaugeMetricFamily("shadow_disk_bytes", "bytes of the disk folder's files",
                                stats["disk_bytes"])
        yield GaugeMetricFamily("shadow_resident_bytes", "resident session bytes",
                                stats["resident_bytes"])
        yield GaugeMetricFamily("shadow_resident_cap_bytes", "the resident cap (bytes)",
                                stats["resident_cap_bytes"])
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


def _labelled(kind, name: str, doc: str, label: str, values: dict):
    family = kind(name, doc, labels=[label])
    for key, n in values.items():
        family.add_metric([key], n)
    return family


def _page_metrics(stats: dict):
    """The page store's counters and gauges (issue 16's names; reader.stats() has the same
    words without the prefix and `_total`)."""
    yield CounterMetricFamily("shadow_prefix_cache_queried_tokens", "prompt ids looked up",
                              stats["prefix_cache_queried_tokens"])
    yield _labelled(CounterMetricFamily, "shadow_prefix_cache_hit_tokens", "prompt ids resumed "
                    "from held pages and state", "tier", stats["prefix_cache_hit_tokens"])
    yield _labelled(CounterMetricFamily, "shadow_reread_tokens", "ids read again below the "
                    "furthest position their session had committed", "cause",
                    stats["reread_tokens"])
    yield _labelled(GaugeMetricFamily, "shadow_pages", "KV pages by state", "state",
                    stats["pages"])
    yield _labelled(GaugeMetricFamily, "shadow_gdn_entries", "GDN table entries by state",
                    "state", stats["gdn_entries"])
    yield GaugeMetricFamily("shadow_gdn_entry_bytes", "bytes of the GDN table's entries",
                            stats["gdn_entry_bytes"])
    yield _labelled(CounterMetricFamily, "shadow_gdn_entry_hits", "resumes and held chunks "
                    "served by GDN entries, by why the entry was stored", "kind",
                    stats["gdn_entry_hits"])
    yield _labelled(CounterMetricFamily, "shadow_gdn_entry_evictions", "GDN entries evicted "
                    "or given up (a tip rotated out of its ring, a checkpoint past its cap), "
                    "by why the entry was stored", "kind", stats["gdn_entry_evictions"])
    yield _labelled(GaugeMetricFamily, "shadow_gdn_entry_kind_bytes", "bytes of the GDN "
                    "table's entries by why the entry was stored", "kind",
                    {k: v["bytes"] for k, v in stats["gdn_entries_by_kind"].items()})
    yield CounterMetricFamily("shadow_gdn_entries_evicted", "GDN entries the table evicted "
                              "(lowest rank, then least recently used first, past its budget "
                              "or the cap; given-up entries included)",
                              stats["gdn_entries_evicted"])
    yield CounterMetricFamily("shadow_pages_reused", "cached pages whose memory was handed out "
                              "again (their content forgotten by memory)", stats["pages_reused"])
    yield _labelled(CounterMetricFamily, "shadow_evicted_written", "evicted pages and GDN "
                    "entries written to disk by key first (files already there not counted)",
                    "kind", stats["evicted_written"])
    yield _labelled(CounterMetricFamily, "shadow_evicted_already_on_disk", "evicted pages "
                    "and GDN entries whose file the disk held already (or was writing)",
                    "kind", stats["evicted_already_on_disk"])
    yield CounterMetricFamily("shadow_tail_hits", "questions that started from a kept tail "
                              "(shadow_plugin.reader.tails)", stats.get("tail_hits", 0))
    yield CounterMetricFamily("shadow_tails_made", "questions' tails forwarded and kept",
                              stats.get("tails_made", 0))
    yield CounterMetricFamily("shadow_tails_evicted", "questions' tails given up (past "
                              "max_tails, past the resident cap, or at a planned stop)",
                              stats.get("tails_evicted", 0))
    yield CounterMetricFamily("shadow_tails_replaced", "sessions' tip tails given up for "
                              "their newer ones", stats.get("tails_replaced", 0))
    yield GaugeMetricFamily("shadow_tails_held", "questions' tails kept",
                            stats.get("tails_held", 0))
    yield GaugeMetricFamily("shadow_tail_bytes", "bytes of the kept tails (a page and a GDN "
                            "state each)", stats.get("tail_bytes", 0))
    yield CounterMetricFamily("shadow_gdn_entries_not_written", "evicted GDN entries not "
                              "written to disk: tips that rotated out of their session's "
                              "ring unused", stats["gdn_entries_not_written"])


def warmest(sessions: dict[str, dict], n: int) -> list[str]:
    """The n warmest sessions of a stats `sessions` dict: most ids resumed from memory alone
    (warm_tokens), then from memory and disk (held_tokens), then the most ids; ties by id."""
    order = sorted(sessions, key=lambda sid: (-sessions[sid]["warm_tokens"],
                                              -sessions[sid]["held_tokens"],
                                              -sessions[sid]["num_ids"], sid))
    return order[:n]


def session_metrics(stats: dict, n: int):
    """This server's name (`shadow_server_info`), the sessions by residency, and the bounded
    per-session series (module doc): backlog of the n largest backlogs, warmth of the n
    warmest."""
    server = stats["server"]
    yield InfoMetricFamily("shadow_server", "this server as a router names it: the writer "
                           "token of its manifests, the identity its page keys are rooted in",
                           value={k: str(v).lower() if isinstance(v, bool) else str(v)
                                  for k, v in sorted(server.items())})
    sessions = stats["sessions"]
    counts = {"resident": 0, "disk": 0, "dropped": 0}
    for s in sessions.values():
        counts[s["residency"]] += 1
    yield _labelled(GaugeMetricFamily, "shadow_sessions", "sessions held, by residency",
                    "residency", counts)
    backlog = GaugeMetricFamily("shadow_backlog_ids", "ids not read yet (the sessions with "
                                "the largest backlogs)", labels=["session"])
    for sid in sorted(sessions, key=lambda sid: (-sessions[sid]["backlog"], sid))[:n]:
        backlog.add_metric([sid[:128]], sessions[sid]["backlog"])
    yield backlog
    chosen = warmest(sessions, n)
    yield GaugeMetricFamily("shadow_session_series_omitted", "sessions without series of "
                            "their own (past SHADOW_METRICS_SESSIONS)",
                            len(sessions) - len(chosen))
    families = {
        "warm_tokens": GaugeMetricFamily("shadow_session_warm_tokens", "ids a session's next "
                                         "turn resumes at from memory alone", labels=["session"]),
        "held_tokens": GaugeMetricFamily("shadow_session_held_tokens", "ids a session's next "
                                         "turn resumes at from memory and this server's disk",
                                         labels=["session"]),
        "num_gdn_entries": GaugeMetricFamily("shadow_session_gdn_entries", "GDN entries a "
                                             "session holds in memory", labels=["session"])}
    pages = GaugeMetricFamily("shadow_session_pages", "pages of a session's chain [0, C) in "
                              "memory and in the disk folder's listing",
                              labels=["session", "tier"])
    size = GaugeMetricFamily("shadow_session_bytes", "bytes a session holds in memory: KV "
                             "pages, GDN states and entries", labels=["kind", "session"])
    for sid in chosen:
        s, label = sessions[sid], sid[:128]
        for key, family in families.items():
            family.add_metric([label], s[key])
        pages.add_metric([label, "memory"], s["num_pages_memory"])
        pages.add_metric([label, "disk"], s["num_pages_disk"])
        size.add_metric(["kv", label], s["kv_bytes"])
        size.add_metric(["gdn", label], s["gdn_bytes"])
    yield from families.values()
    yield pages
    yield size
