"""A door (server.routes) over the shadows of several engines that share one disk folder: vLLM's
data-parallel ranks, each engine with its own shadow in its own worker (docs/vllm.md, "Data
parallelism"). Each rank is reached by its own call, `call(rank, name, kwargs) -> reply`
(server.remote's replies); `call_all(name, kwargs)` gives one reply per rank, in rank order.

- A question, a check or a narration goes to the rank that holds the session's newest state
  (`holder`): of the ranks that know it, the one whose copy carries the newest manifest
  version (each turn's start writes one, one past the version it replaced, whoever wrote it:
  docs/sessions.md, "Several servers on one folder"), in memory before one parked, then the
  one holding more ids, then the lowest rank. One lookup (`holds` on every rank) per request.
- The status merges the ranks: the settings of rank 0, a state that is "ready" once every
  rank is, the counters summed (SUMMED; the folder's own counts once: FOLDER), each session
  as its holder holds it (with `rank`, and `ranks`: every rank that knows it), and `ranks`:
  each rank's own status without its sessions (with `rank` and `sessions_resident`).
- One rank: the door is server.remote.RemoteService itself (nothing merged, no lookup).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

from shadow_plugin.server.errors import NotReady
from shadow_plugin.server.remote import RemoteService, RemoteShadow, unpack

RankCall = Callable[[int, str, dict], Any]      # (rank, name, kwargs) -> a serve_call reply
AllCall = Callable[[str, dict], list]           # (name, kwargs) -> one reply per rank

# Counters and gauges summed over the ranks (numbers, or dicts of numbers summed key by key);
# everything else in a merged status is rank 0's, or merged below.
SUMMED = ("read_tokens", "totals", "chunks_by_window", "prefix_cache_queried_tokens",
          "prefix_cache_hit_tokens", "reread_tokens", "turn_starts", "gdn_entry_hits",
          "gdn_entry_evictions", "pages", "gdn_entries", "gdn_entry_bytes",
          "gdn_entries_by_kind", "resident_bytes", "resident_cap_bytes", "pool_bytes",
          "num_resident", "num_parked", "spills", "drops", "restores", "restore_ms", "prefetch",
          "refusals", "refusal_reasons", "deleted_files", "superseded", "write_errors",
          "gdn_entries_evicted", "pages_reused", "evicted_written", "gdn_entries_not_written",
          "evicted_already_on_disk", "ration_ms", "host_decode_ms", "restarts")
# The longest read's own parts (reader.Reader.totals): taken with it from one rank, never
# merged key by key, which would pair one rank's longest read with another's parts.
LONGEST_READ = ("read_max_ms", "read_max_host_part_ms", "read_max_gc_ms", "read_max_forward_ms",
                "read_max_num_chunks", "read_max_cpu_ms", "read_max_num_chunks_before")
# What every rank counts of the one shared folder: taken once (the largest), not summed.
FOLDER = (("disk_bytes",), ("pages", "disk"), ("gdn_entries", "disk"))
LISTS = ("open_turns", "refused_sessions", "last_answers")      # concatenated over the ranks


def holder(found: Sequence[dict | None]) -> int | None:
    """The rank holding a session's newest state, from each rank's `holds` entry for it
    (facade.Shadow.holds: {num_ids, committed, resident, version}, None where unknown): the
    newest manifest version, then resident, then more ids, then the lowest rank. None when
    no rank knows the session."""
    known = [(rank, h) for rank, h in enumerate(found) if h is not None]
    if not known:
        return None
    def rank_key(item):
        rank, h = item
        version = -1 if h.get("version") is None else h["version"]
        return (version, bool(h.get("resident")), h.get("num_ids", 0), -rank)
    return max(known, key=rank_key)[0]


def _add(a, b, key: str = ""):
    """a + b for numbers, key by key (recursively) for dicts of numbers; the larger for a
    key ending in `_max_ms` (a longest one, e.g. totals' read_max_ms); a when b is missing
    or of another kind."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _add(a[k], b[k], k) if k in a and k in b else a.get(k, b.get(k))
                for k in {**a, **b}}
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and \
            not isinstance(a, bool) and not isinstance(b, bool):
        return max(a, b) if key.endswith("_max_ms") else a + b
    return a


def merge_sessions(per_rank: Sequence[dict]) -> dict:
    """{session: its entry on the rank holding its newest state (`holder` over the entries'
    version, residency and num_ids), with `rank` (that rank) and `ranks` (every rank that
    knows it)}, from each rank's {session: stats entry}."""
    out: dict[str, dict] = {}
    for sid in {s for sessions in per_rank for s in sessions}:
        found = [_entry_holds(sessions.get(sid)) for sessions in per_rank]
        rank = holder(found)
        out[sid] = {**per_rank[rank][sid], "rank": rank,
                    "ranks": [r for r, f in enumerate(found) if f is not None]}
    return dict(sorted(out.items()))


def _entry_holds(entry: dict | None) -> dict | None:
    """A status entry of a session (block_store.SessionTable.stats) as a `holds` entry."""
    if entry is None:
        return None
    return {"num_ids": entry.get("num_ids", 0), "committed": entry.get("committed", 0),
            "resident": entry.get("residency") == "resident", "version": entry.get("version")}


def merge_stats(per_rank: Sequence[dict]) -> dict:
    """One status (or metrics) dict from the ranks' (module doc): rank 0's fields, SUMMED
    summed, FOLDER counted once, LISTS concatenated, the sessions merged (merge_sessions),
    question_ms's histograms summed bucket by bucket."""
    out = dict(per_rank[0])
    for stats in per_rank[1:]:
        for key in SUMMED:
            if key in out and key in stats:
                out[key] = _add(out[key], stats[key], key)
        for key in LISTS:
            if isinstance(out.get(key), list) and isinstance(stats.get(key), list):
                out[key] = out[key] + stats[key]
        if "question_ms" in out and "question_ms" in stats:
            a, b = out["question_ms"], stats["question_ms"]
            out["question_ms"] = {"buckets": [[x[0], x[1] + y[1]] for x, y in
                                              zip(a["buckets"], b["buckets"])],
                                  "sum": a["sum"] + b["sum"]}
    _longest_read_whole(out, per_rank)
    for path in FOLDER:
        values = [_get(stats, path) for stats in per_rank]
        values = [v for v in values if isinstance(v, (int, float))]
        if values:
            _set(out, path, max(values))
    if all("sessions" in stats for stats in per_rank):
        out["sessions"] = merge_sessions([stats["sessions"] for stats in per_rank])
    if isinstance(out.get("refused_sessions"), list):
        _one_refusal_a_file(out)
    return out


def _longest_read_whole(out: dict, per_rank: Sequence[dict]) -> None:
    """out's totals get LONGEST_READ from the rank whose read_max_ms is the largest; the parts
    that rank lacks (an older version) are left out, not taken from another rank's read."""
    totals = [s["totals"] for s in per_rank if isinstance(s.get("totals"), dict)]
    if not isinstance(out.get("totals"), dict) or not totals:
        return
    top = max(totals, key=lambda t: t.get("read_max_ms", 0.0))
    kept = {k: v for k, v in out["totals"].items() if k not in LONGEST_READ}
    out["totals"] = {**kept, **{k: top[k] for k in LONGEST_READ if k in top}}


def _one_refusal_a_file(out: dict) -> None:
    """A manifest of the shared folder that every rank refused at start-up is one refusal:
    `refused_sessions` keeps one entry a (session, file), and `refusals` and
    `refusal_reasons` (each rank counted it once) lose the copies."""
    seen, kept = set(), []
    for entry in out["refused_sessions"]:
        key = (entry.get("session"), entry.get("file"))
        if key not in seen:
            seen.add(key)
            kept.append(entry)
            continue
        reason = str(entry.get("reason", "")).split(":", 1)[0]
        if isinstance(out.get("refusals"), int):
            out["refusals"] -= 1
        reasons = out.get("refusal_reasons")
        if isinstance(reasons, dict) and reasons.get(reason, 0) > 0:
            reasons[reason] -= 1
    out["refused_sessions"] = kept


def _get(d: dict, path: tuple[str, ...]):
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def _set(d: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        d[key] = dict(d[key])                 # a copy: rank 0's own dict stays as it was
        d = d[key]
    d[path[-1]] = value


def merge_status(replies: Sequence) -> dict:
    """The merged status (module doc) from each rank's status reply (serve_call's: ("ok",
    status) or an error reply, e.g. NotReady while a rank's engine starts). `state`: "failed"
    when a rank failed, "loading" while one loads, else "ready"; `error` names the ranks'."""
    ranks, ready = [], []
    for rank, reply in enumerate(replies):
        if reply[0] == "ok":
            status = reply[1]
        else:                                  # the rank did not answer its status
            why = reply[2][0] if reply[2] else reply[1]
            failed = reply[1] != "NotReady" or (len(reply[2]) > 1 and bool(reply[2][1]))
            status = {"state": "failed" if failed else "loading", "error": str(why)}
        ranks.append((rank, status))
        if status.get("state") == "ready":
            ready.append(status)
    states = [s.get("state") for _, s in ranks]
    base = merge_stats(ready) if len(ready) == len(ranks) else dict(ranks[0][1])
    state = "failed" if "failed" in states else "ready" if len(ready) == len(ranks) \
        else "loading"
    errors = [f"rank {r}: {s['error']}" for r, s in ranks if s.get("error")]
    base.update({"state": state, "error": "; ".join(errors) or None,
                 "num_ranks": len(ranks),
                 "ranks": [_rank_section(r, s) for r, s in ranks]})
    if state != "ready":
        base.pop("sessions", None)
    return base


def _rank_section(rank: int, status: dict) -> dict:
    """A rank's own status without its sessions: `rank`, and `sessions_resident` (the ids of
    the sessions whose state it holds in memory)."""
    sessions = status.get("sessions") or {}
    return {**{k: v for k, v in status.items() if k != "sessions"}, "rank": rank,
            "sessions_resident": sorted(s for s, e in sessions.items()
                                        if e.get("residency") == "resident")}


def merge_metrics(replies: Sequence) -> dict | None:
    """The ranks' metrics (facade.Shadow.metrics) as one (merge_stats) for
    server.metrics.Collector, from the ranks that answered; None when none did."""
    ok = [reply[1] for reply in replies if reply[0] == "ok"]
    return merge_stats(ok) if ok else None


class RankedService:
    """The door over `num_ranks()` ranks (module doc). `num_ranks` is asked at each use (an
    engine's ranks are known once its client is up, after the routes were attached); with one
    rank the door is RemoteService over rank 0."""

    def __init__(self, call: RankCall, call_all: AllCall, num_ranks: Callable[[], int]):
        self._call, self._call_all, self._num_ranks = call, call_all, num_ranks
        self._single = RemoteService(functools.partial(call, 0))
        self._grid: list[int] = []             # the shadows' grid, once every rank was ready

    def status(self) -> dict:
        if self._num_ranks() <= 1:
            return self._single.status()
        return merge_status(self._call_all("status", {}))

    def require(self) -> "RankedShadow | RemoteShadow":
        """The facade's question methods over the ranks. Makes no call (a route calls it on
        the event loop's thread): a rank whose shadow is not ready answers NotReady (503) to
        the calls themselves."""
        if self._num_ranks() <= 1:
            return self._single.require()
        return RankedShadow(self._call, self._call_all, self._grid_of)

    def _grid_of(self) -> int:
        """The shadows' grid (the same setting on every rank: a status call the first time,
        from a worker thread), from the first rank that is ready; NotReady while none is."""
        if not self._grid:
            replies = self._call_all("status", {})
            ready = [r[1] for r in replies if r[0] == "ok" and r[1].get("state") == "ready"]
            if not ready:
                status = merge_status(replies)
                raise NotReady(status.get("error") or "the shadows are loading",
                               status["state"] == "failed")
            self._grid.append(ready[0]["grid"])
        return self._grid[0]


def _ready_replies(replies, empty=None) -> tuple[list, NotReady | None]:
    """The ranks' replies to a call about their sessions: (each rank's result, or `empty`
    (default {}) for a rank that is not ready: it knows nothing; the NotReady that makes a
    session no ready rank knows a 503: a loading rank's (it may hold it once up), else the
    first failed one's when no rank is ready at all; None when every rank not ready failed to
    load and another is ready: those hold nothing, ever). Other errors are raised."""
    out, loading, failed, num_ready = [], None, None, 0
    for reply in replies:
        try:
            out.append(unpack(reply))
            num_ready += 1
        except NotReady as e:
            out.append({} if empty is None else dict(empty))
            if e.failed:
                failed = failed or e
            else:
                loading = loading or e
    return out, loading or (failed if num_ready == 0 else None)


class RankedShadow:
    """RemoteShadow's methods over the ranks: a session's calls go to its holder (looked up
    once per session for this object: one request's), the others to every rank."""

    def __init__(self, call: RankCall, call_all: AllCall, grid: Callable[[], int]):
        self._call, self._call_all, self._grid = call, call_all, grid
        self._holders: dict[str, int] = {}

    @property
    def grid(self) -> int:
        return self._grid()                    # a status call the first time only

    def _holds(self, sessions: list[str]) -> dict[str, tuple[int | None, dict | None]]:
        """{session: (holder rank, its entry)}, one `holds` call on every rank. A rank that is
        not ready (loading, or failed) knows nothing here: a session another rank holds is
        served there (it reads the newest manifest from the shared folder first), and a
        session no ready rank knows raises a loading rank's NotReady (503: it may be held
        there once it is up), not KeyError; a rank that failed to load holds nothing, ever
        (it follows nothing), so with only such ranks not ready the session is unknown
        (KeyError), and with no rank ready at all it is the failure's NotReady."""
        replies, unready = _ready_replies(self._call_all("holds", {"sessions": list(sessions)}))
        out = {}
        for s in sessions:
            found = [reply.get(s) for reply in replies]
            rank = holder(found)
            if rank is None and unready is not None:
                raise unready
            out[s] = (rank, None if rank is None else found[rank])
        return out

    def rank_of(self, session: str) -> int:
        """The rank holding the session (`holder`), looked up once; KeyError (404) when no
        rank knows it."""
        if session not in self._holders:
            rank = self._holds([session])[session][0]
            if rank is None:
                raise KeyError(f"unknown session {session!r}")
            self._holders[session] = rank
        return self._holders[session]

    def on(self, session: str) -> RemoteShadow:
        """The RemoteShadow of the rank holding `session`."""
        return RemoteShadow(functools.partial(self._call, self.rank_of(session)), self._grid)

    def positions(self, sessions: list[str]) -> dict:
        """{session: [ids held, C] on its holder, or None when no rank knows it}."""
        return {s: None if h is None else [h["num_ids"], h["committed"]]
                for s, (_, h) in self._holds(sessions).items()}

    def fork_position(self, session: str, at: int | None) -> int:
        return self.on(session).fork_position(session, at)

    def ask(self, session: str, question, choices, at: int | None, fork_at: int | None,
            cancelled=None):
        return self.on(session).ask(session, question, choices, at, fork_at, cancelled)

    def ask_many(self, session: str, items: list, at: int | None, fork_at: int | None,
                 cancelled=None):
        """Several questions over the session in one forward, on its holder."""
        return self.on(session).ask_many(session, items, at, fork_at, cancelled)

    def summarize(self, session: str, instruction: str, max_tokens: int, at: int | None,
                  cancelled=None):
        return self.on(session).summarize(session, instruction, max_tokens, at, cancelled)

    def narration(self, session: str) -> dict:
        return self.on(session).narration(session)

    def check(self, session: str, cancelled=None) -> dict:
        """The session's exactness check on its holder, with `rank` (RemoteShadow.check:
        `cancelled` stops the wait here, the check runs to its end in the worker)."""
        return {**self.on(session).check(session, cancelled), "rank": self.rank_of(session)}

    def sessions(self) -> dict:
        """Every rank's sessions, merged (merge_sessions); a rank that failed to load holds
        none. NotReady (503) while a rank loads (the list could miss its sessions) or when no
        rank is ready."""
        replies, unready = _ready_replies(self._call_all("sessions", {}), {"sessions": {}})
        if unready is not None:
            raise unready
        return {"sessions": merge_sessions([r["sessions"] for r in replies])}

    def not_reading_why(self, session: str | None = None) -> str:
        """Why the session's holder has not read its backlog; without a session, every rank's
        reason ("rank R: ..." joined by "; ")."""
        if session is not None:
            return self.on(session).not_reading_why(session)
        return "; ".join(f"rank {rank}: {unpack(reply)}" for rank, reply in
                         enumerate(self._call_all("not_reading_why", {})))
