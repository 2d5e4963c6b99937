"""`shadow-reader fresh`: replay recorded request timelines through the real scheduler on virtual
time and measure how fresh the shadow stays (issue 6).

Each request's prompt grows its session to `prompt_tokens` ids; the host is busy from the
request's start to its end; its output arrives between the first token and the end, and the
ration is offered between rounds every `round_s`; idle bursts are polled every poll_s while no
request runs, and at once when a turn finishes (SchedulerConfig.idle_at_finish). Reading costs
what the cost model says. The timelines' token counts come from other tokenizers (their
README): they are used as they are. A request without a first token time gets the midpoint of
start and end; one without an end, the next request's start (at most start + 30 s). Sub-agent requests (`sidechain`) and requests of another model are their own
sessions.

The backlog at a turn start is the ids the shadow held from earlier turns but had not
committed when the new prompt arrives; fresh means below one grid chunk.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from shadow_plugin.scheduling.scheduler import CostModel, Scheduler, SchedulerConfig, VirtualClock


@dataclass(frozen=True)
class Request:
    session: str
    start_s: float
    first_token_s: float
    end_s: float
    prompt_tokens: int
    output_tokens: int


START = ("request_start", "request_start_approx")


def _time(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value) / 1e3                                  # ms since the epoch
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _field(where: str, r: dict, keys: tuple[str, ...], parse):
    """parse(the first of `keys` present in r), or None; ValueError naming the file, the
    request and the field for a value that does not parse or is negative or not finite."""
    key = next((k for k in keys if r.get(k) is not None), None)
    if key is None:
        return None
    try:
        value = parse(r[key])
        ok = math.isfinite(value) and (parse is _time or value >= 0)
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ValueError(f"{where}: {key} = {r[key]!r} is not a "
                         f"{'time' if parse is _time else 'non-negative count'}")
    return value


def load_timeline(path) -> list[Request]:
    """All requests of a timeline file, in start order. ValueError naming the file for one
    that is not JSON, not a timeline (an object with a "sessions" list of sessions with
    "requests") or has no requests."""
    try:
        raw = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    sessions = raw.get("sessions") if isinstance(raw, dict) else None
    if not isinstance(sessions, list) or not all(
            isinstance(x, dict) and isinstance(x.get("requests"), list) for x in sessions):
        raise ValueError(f"{path}: not a request timeline (expected an object with a "
                         f"\"sessions\" list, each session with a \"requests\" list; see "
                         f"shared/data/README.md, timelines/)")
    out = []
    for sess in sessions:
        reqs = sess["requests"]
        for i, r in enumerate(reqs):
            where = f"{path}: request {i} of {sess.get('session_id')}"
            if not isinstance(r, dict):
                raise ValueError(f"{where} is not an object")
            start = _field(where, r, START, _time)
            prompt = _field(where, r, ("prompt_tokens", "prompt_tokens_qwen_est",
                                       "prompt_tokens_est"), int)
            if start is None or prompt is None:
                raise ValueError(f"{where} has no start or prompt size")
            nxt = _field(where, reqs[i + 1], START, _time) \
                if i + 1 < len(reqs) and isinstance(reqs[i + 1], dict) else None
            end = _field(where, r, ("request_end", "request_end_approx"), _time)
            if end is None:
                end = min(nxt, start + 30.0) if nxt is not None else start + 30.0
            if end < start:
                raise ValueError(f"{where} ends before it starts")
            first = _field(where, r, ("first_token", "first_block_logged"), _time)
            first = (start + end) / 2 if first is None else min(max(first, start), end)
            side = ":side" if r.get("sidechain") else ""
            model = f":{r['model']}" if "haiku" in str(r.get("model", "")) else ""
            output = _field(where, r, ("output_tokens", "output_tokens_logged",
                                       "output_tokens_qwen_est"), int)
            out.append(Request(f"{sess.get('session_id')}{side}{model}", start, first, end,
                               prompt, output or 0))
    if not out:
        raise ValueError(f"{path}: the timeline holds no requests")
    return sorted(out, key=lambda q: q.start_s)


class SimReader:
    """Sessions as integers; a chunk costs `ms_per_1k(context)` x grid / 1000 of virtual time."""

    def __init__(self, clock, grid: int, ms_per_1k):
        self.clock, self.grid, self.ms_per_1k = clock, grid, ms_per_1k
        self.ids: dict[str, int] = {}
        self.c: dict[str, int] = {}

    def backlog(self, s: str) -> int:
        return self.ids[s] - self.c[s]

    def committed(self, s: str) -> int:
        return self.c[s]

    def read_chunk(self, s: str) -> float:
        ms = self.ms_per_1k(self.c[s]) * self.grid / 1000
        self.c[s] += self.grid
        self.clock.t += ms / 1e3
        return ms

    def read_chunks(self, sessions: list[str]) -> tuple[float, list[str]]:
        """One chunk of each (SHADOW_BATCH_SESSIONS > 1), costed one after another: (ms, the
        sessions read)."""
        return sum(self.read_chunk(s) for s in sessions), list(sessions)

    def answer(self, s: str, at: int) -> None:
        pass

    def make_tail(self, sessions: list[str]) -> float | None:
        return None          # questions' tails are not simulated (no question asks here)

    def prompt(self, s: str, n: int) -> None:
        """A new prompt of n ids (a shorter one rewrote the session: C falls back)."""
        self.ids[s] = n
        self.c[s] = min(self.c.get(s, 0), n // self.grid * self.grid)


def percentile(values: list[int], q: float) -> int:
    """Nearest-rank percentile (q in (0, 1]); 0 for no values."""
    if not values:
        return 0
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


@dataclass
class _Run:
    clock: VirtualClock
    reader: SimReader
    sched: Scheduler
    busy: list
    next_start: list


def _idle_until(run: _Run, until: float, at_once: bool) -> None:
    """Poll the idle window every poll_s until `until`, the first poll now when `at_once`
    (the last turn just finished, SchedulerConfig.idle_at_finish); stops early once all are
    fresh."""
    wait = 0.0 if at_once else run.sched.cfg.poll_s
    while run.clock.t + wait < until:
        run.clock.t += wait
        burst = run.sched.idle_burst()
        if burst is not None and burst.stop == "fresh":
            return
        wait = run.sched.cfg.poll_s


def _decode(run: _Run, r: Request, ration: bool, round_s: float) -> float:
    """Output arrives from the first token to the end; the ration is offered every round.
    Returns the ration ms used."""
    run.clock.t = max(run.clock.t, r.first_token_s)
    run.sched.output(r.session)
    produced, used, span = 0, 0.0, max(r.end_s - r.first_token_s, 1e-9)
    while run.clock.t + round_s < r.end_s:
        run.clock.t += round_s
        due = int(r.output_tokens * (run.clock.t - r.first_token_s) / span)
        run.reader.ids[r.session] += due - produced
        produced = due
        if ration:
            used += run.sched.between_rounds(r.session).ms
    run.clock.t = max(run.clock.t, r.end_s)
    run.reader.ids[r.session] += r.output_tokens - produced
    return used


def simulate(requests: list[Request], cfg: SchedulerConfig, ms_per_1k, ration: bool,
             round_s: float = 0.1) -> dict:
    """Freshness at turn starts for one arm (idle window alone, or idle + ration).

    `ms_per_1k(context) -> float` is the read cost. Returns fresh_share, backlog_p50,
    backlog_p90, host_share (ration ms over the host's decode time), `trace`: per turn
    (session, start s, backlog), and `host_waits_ms`: for each request that found an idle
    chunk running, how long it waited for it."""
    clock = VirtualClock(requests[0].start_s if requests else 0.0)
    reader = SimReader(clock, cfg.grid, ms_per_1k)
    busy, next_start = [False], [math.inf]
    sched = Scheduler(cfg, reader, clock, lambda: busy[0] or clock.t >= next_start[0],
                      CostModel(ms_per_1k(0), cfg.grid))
    run = _Run(clock, reader, sched, busy, next_start)
    trace, ration_ms, decode_s, woken, waits = [], 0.0, 0.0, False, []
    for r in requests:
        next_start[0] = r.start_s
        free_s = max(clock.t, r.start_s)         # when the request could start without us
        _idle_until(run, r.start_s, woken)
        if clock.t > free_s:
            waits.append((clock.t - free_s) * 1e3)       # an idle chunk ran into the request
        clock.t = max(clock.t, r.start_s)
        held = reader.ids.get(r.session, 0)
        trace.append((r.session, r.start_s, max(0, held - reader.c.get(r.session, 0))))
        reader.prompt(r.session, r.prompt_tokens)
        busy[0] = True
        sched.turn_started(r.session)
        ration_ms += _decode(run, r, ration, round_s)
        decode_s += r.end_s - r.first_token_s
        busy[0], next_start[0] = False, math.inf
        woken = sched.turn_finished(r.session)
    backlogs = [b for _, _, b in trace]
    return {"fresh_share": sum(b < cfg.grid for b in backlogs) / max(len(backlogs), 1),
            "backlog_p50": percentile(backlogs, 0.5), "backlog_p90": percentile(backlogs, 0.9),
            "host_share": ration_ms / max(decode_s * 1e3, 1e-9), "trace": trace,
            "host_waits_ms": waits}


def cost_from_bench(path) -> tuple[str, callable]:
    """(name, ms_per_1k(context)) from a `shadow-reader bench` JSON: the grid-512 read bands,
    through CUDA graphs when the run measured them, else eager. The name says the file, its GPU,
    date and read path and the bands. KeyError when it has neither."""
    res = json.loads(Path(path).read_text())
    part = res.get("read_grid512_cuda_graphs") or res["read_grid512"]
    bands = part["ms_per_1k"]
    about = ", ".join(str(x) for x in (res.get("gpu"), res.get("date"), part.get("path")) if x)
    path = f"{path} ({about}; ms per 1,000 ids by context: " + \
        ", ".join(f"{band} {ms}" for band, ms in bands.items()) + ")"
    table = []
    for band, ms in bands.items():
        lo, hi = (int(x.rstrip("k")) * 1024 for x in band.split("-"))
        table.append((lo, hi, float(ms)))
    last = max(table)[2]

    def ms_per_1k(context: int) -> float:
        return next((ms for lo, hi, ms in table if lo <= context < hi), last)
    return str(path), ms_per_1k


def fresh_report(paths: list[str], cfg: SchedulerConfig, cost_name: str, ms_per_1k) -> dict:
    """Both arms over the requests of all `paths` (each file simulated on its own)."""
    arms = {"idle": [], "idle_ration": []}
    waits = {"idle": [], "idle_ration": []}
    host = []
    for p in paths:
        reqs = load_timeline(p)
        idle = simulate(reqs, cfg, ms_per_1k, ration=False)
        both = simulate(reqs, cfg, ms_per_1k, True)
        arms["idle"] += [b for *_, b in idle["trace"]]
        arms["idle_ration"] += [b for *_, b in both["trace"]]
        waits["idle"] += idle["host_waits_ms"]
        waits["idle_ration"] += both["host_waits_ms"]
        host.append((both["host_share"], sum(r.end_s - r.first_token_s for r in reqs)))
    out = {k: {"fresh_share": round(sum(b < cfg.grid for b in v) / max(len(v), 1), 4),
               "backlog_p50": percentile(v, 0.5), "backlog_p90": percentile(v, 0.9),
               "num_host_waits": len(waits[k]),             # requests that met an idle chunk
               "host_wait_ms_max": round(max(waits[k], default=0.0), 2)}
           for k, v in arms.items()}
    total = sum(w for _, w in host)
    out["idle_ration"]["host_share"] = round(sum(s * w for s, w in host) / max(total, 1e-9), 5)
    out["turns"] = len(arms["idle"])
    out["cost_model"] = cost_name
    out["scheduler"] = dataclasses.asdict(cfg)                   # the settings in effect
    return out


def plot_backlog(requests: list[Request], cfg: SchedulerConfig, ms_per_1k, session: str | None,
                 path) -> str:
    """PNG of one session's backlog at each turn start over time, both arms (matplotlib, the
    `plot` extra). `session`: None for the session with the most turns. Returns its id."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    counts: dict[str, int] = {}
    for r in requests:
        counts[r.session] = counts.get(r.session, 0) + 1
    session = session or max(counts, key=counts.get)
    if session not in counts:
        raise ValueError(f"no session {session!r} in the timeline")
    fig, ax = plt.subplots(figsize=(9, 4))
    for ration, label in ((False, "idle window"), (True, "idle + ration")):
        trace = simulate(requests, cfg, ms_per_1k, ration)["trace"]
        pts = [(t, b) for s, t, b in trace if s == session]
        t0 = pts[0][0]
        ax.step([(t - t0) / 60 for t, _ in pts], [b for _, b in pts], where="post", label=label)
    ax.axhline(cfg.grid, color="grey", linestyle=":", label=f"fresh (< {cfg.grid} ids)")
    ax.set(xlabel="minutes", ylabel="backlog at turn start (ids)", title=f"session {session}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return session
