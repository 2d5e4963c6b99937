"""`shadow-reader fresh --agents N`: N recorded timelines overlaid on one virtual clock, one host
with continuous batching, one shadow (issue 36, item 1). A simulation, as `fresh` is
(evals/fresh.py): the real Scheduler and the engine's StepBudget on virtual time, the reader a
counter whose chunks cost what the cost model says.

The overlay. Agent i of rotation j replays timelines[(j + i) % k] of the k given, moved so that
it starts with rotation j's first timeline (agent 0) plus an offset: 0 for agent 0, uniform in
`[0, window_s)` for the others (random.Random seeded with the seed, N and j: the same seed gives
the same overlay). window_s defaults to the span of the rotation's first timeline (its first
start to its last end). Sessions are named `a{i}:{session}`, so an agent that reuses a
timeline (N > k) has its own sessions. The report pools the k rotations, so every timeline is
the first once and N=1 pools the k single-timeline runs: `fresh`'s `idle_ration` arm.

The host. Busy while any request of any agent runs; the idle window opens only in the gaps of
all. Each agent's requests run one after another in start order, as `fresh` runs a timeline's
(a request that starts before the agent's previous one ended waits for it). Continuous
batching: decode slows with the batch as `EngineModel.stretch` says; a request's decode takes
its recorded time (first token to end) times the stretch of the batches it ran in, and the
agent's later requests move by what its requests were stretched (the gaps, the agent's tool
time, stay as recorded). TTFT stays as recorded (prefill is not stretched), and the shadow's
reads do not push the host's ends (as in `fresh`; at a 2 % share at most 2 % of the decode).

The shadow. Every `round_s` of decode the engine runs one step's slot: StepBudget (the real one,
shadow_plugin.engine.turnstile) keeps the slot's time at most SHADOW_SHARE of the steps' time
for the whole engine and gives the slot to one decoding session a step, in turn; that turn's
own ration (Scheduler.between_rounds) limits it too. Only the `idle + ration` arm is run.

Chunk costs: `chunk_ms(contexts)` is the hook for a batched read (the ms of one forward that
reads one chunk of each session at these contexts, in ids); the scheduler reads one chunk at a
time (with SHADOW_BATCH_SESSIONS > 1, one chunk of each of several sessions a call), and the
default, `one_at_a_time`, is the sum of the measured cost model's chunks. `batched_costs` is
that sum times the batching's gain that `python -m evals.bi_bench --parts chunks` (the
batched read inside the CUDA graphs; or `--parts read`, the eager one) measured
(`fresh --agents N --batch-costs FILE --batch-sessions B`).
"""
from __future__ import annotations

import dataclasses
import math
import platform
import random
import re
from dataclasses import dataclass, field, replace
from datetime import date
from importlib import metadata
from pathlib import Path
from typing import Callable, Sequence

from evals.fresh import Request, SimReader, _idle_until, _Run, load_timeline, percentile
from shadow_plugin.engine.turnstile import StepBudget
from shadow_plugin.scheduling.scheduler import CostModel, Scheduler, SchedulerConfig, VirtualClock

ChunkMs = Callable[[Sequence[int]], float]   # contexts (ids) of a forward's chunks -> its ms
ONE_AT_A_TIME = ("one-at-a-time chunk costs (a batched read costs its chunks' sum: "
                 "fresh --batch-costs gives the measured batched read)")


@dataclass(frozen=True)
class EngineModel:
    """The host under continuous batching, a stated model (not measured).

    decode_alpha: a decode step of b requests takes step_ms(1) * (1 + decode_alpha * (b - 1)).
    Source of the default 0.08: the memory-bound roofline of the host, Qwen3.5-27B in bf16. A
    step reads the weights once (about 27e9 x 2 B = 54 GB) and each request's KV: 16
    full-attention layers (one in four of 64) x K and V x 4 KV heads x 256 x 2 B = 64 KiB an
    id (shapes of THUDM/slime scripts/models/qwen3.5-27B.sh: 64 layers, 4 query groups,
    kv-channels 256); at the timelines' median prompt, about 66k ids (Claude Code's p50,
    shared/data/README.md), that is 4.3 GB, 0.08 of the weights. GDN states (about 0.15 GB a
    request), compute and prefill chunks riding in the step are left out.
    round_s: virtual seconds between two slots (the sim's step; `fresh`'s round, 0.1 s)."""

    decode_alpha: float = 0.08
    round_s: float = 0.1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.decode_alpha) and self.decode_alpha >= 0):
            raise ValueError(f"decode_alpha must be finite and >= 0, got {self.decode_alpha!r}")
        if not (math.isfinite(self.round_s) and self.round_s > 0):
            raise ValueError(f"round_s must be finite and > 0, got {self.round_s!r}")

    def stretch(self, num_running: int) -> float:
        """step_ms(b) / step_ms(1) for b = num_running requests (1.0 for 0 or 1)."""
        return 1.0 + self.decode_alpha * (max(num_running, 1) - 1)


@dataclass(frozen=True)
class OverlayConfig:
    """num_agents; seed of the offsets; window_s: offsets uniform in [0, window_s) (None: the
    span of the rotation's first timeline, s)."""

    num_agents: int
    seed: int = 0
    window_s: float | None = None

    def __post_init__(self) -> None:
        if self.num_agents < 1:
            raise ValueError(f"num_agents must be >= 1, got {self.num_agents}")
        if self.window_s is not None and not (math.isfinite(self.window_s)
                                              and self.window_s >= 0):
            raise ValueError(f"window_s must be finite and >= 0, got {self.window_s!r}")


def one_at_a_time(ms_per_1k, grid: int) -> ChunkMs:
    """The chunks of a forward read one after another: the sum of ms_per_1k(context) x grid /
    1000 (the cost model `fresh` uses)."""
    def chunk_ms(contexts: Sequence[int]) -> float:
        return sum(ms_per_1k(c) * grid / 1000 for c in contexts)
    return chunk_ms


def _ms(arm) -> float | None:
    """An arm's positive finite `ms`, else None."""
    ms = arm.get("ms") if isinstance(arm, dict) else None
    ok = isinstance(ms, (int, float)) and not isinstance(ms, bool) and math.isfinite(ms) \
        and ms > 0
    return float(ms) if ok else None


def batch_ratios(bench: dict, grid: int) -> dict[int, list[tuple[int, float]]]:
    """Per measured context (ids), the batching's gain by batch size: [(B, one forward's ms /
    the same B chunks' ms one at a time)] for B > 1, ascending, from a `python -m
    evals.bi_bench` JSON (the object --out writes, or one part alone):

    - its `chunks` part where it has one (the batched read inside the CUDA graphs, which the
      service runs on CUDA): rows "{context}x{B}" with `one_forward` / `one_at_a_time` ms; a
      row whose `exact` is false is left out;
    - else its `read` part: rows "{context}x{B}" (`ms`: one round, B chunks one at a time on
      'eager+bi' (bi_alone) or in one forward (bi_batch); both arms run the same kernels, so
      the ratio is the batching's alone); a context is left out where "{context}_exact" says
      the adapter did not batch ("batches": false) or the batched states were not bit-exact
      ("exact": false).

    A row where an arm or its ms is missing is left out. ValueError when the bench's grid is
    not `grid`, or no row is left (the message says why each was left out)."""
    if not isinstance(bench, dict):
        raise ValueError("not a bi_bench JSON object (python -m evals.bi_bench --out FILE)")
    if "grid" in bench and bench["grid"] != grid:
        raise ValueError(f"the batched read was measured at grid {bench['grid']}, the "
                         f"simulation reads at grid {grid} (--grid)")
    part, graphs = batch_part(bench)
    out, why = (_graph_rows if graphs else _eager_rows)(part)
    if not out:
        raise ValueError("no usable batched read rows (\"{context}x{B}\", B > 1, with "
                         "one_at_a_time and one_forward or bi_alone and bi_batch ms, exact)"
                         + (f": {'; '.join(why)}" if why else "")
                         + "; measure them with python -m evals.bi_bench --parts chunks "
                         "--out FILE on CUDA")
    return {c: sorted(rows) for c, rows in sorted(out.items())}


def batch_part(bench: dict) -> tuple[dict, bool]:
    """(the part of a bi_bench JSON that batch_ratios reads, whether it is the CUDA graphs'
    `chunks` part (else the eager `read` part)). ValueError when that part is not an object."""
    chunks = bench.get("chunks")
    part = chunks if isinstance(chunks, dict) else bench.get("read", bench)
    if not isinstance(part, dict):
        raise ValueError("its \"read\" part is not an object")
    return part, isinstance(chunks, dict) or any(
        isinstance(row, dict) and "one_forward" in row for row in part.values())


def _batch_rows(part: dict):
    """(context, B, row) of a bench part's "{context}x{B}" rows with B > 1."""
    for key, row in part.items():
        m = re.fullmatch(r"(\d+)x(\d+)", key)
        if m and int(m[2]) > 1:
            yield int(m[1]), int(m[2]), row


def _graph_rows(part: dict) -> tuple[dict, list[str]]:
    """batch_ratios of a `chunks` part: ({context: [(B, ratio)]}, why rows were left out),
    from the arms of the row-invariant chunk ops where the part has them (the op set the
    runners use on CUDA by default): its `chunk_ops` says which op set the unprefixed arms
    are and which others it has (`rowwise_...`); a part without it (before 2026-12-06's
    bi_bench), `rowwise_` arms where there are any."""
    out: dict[int, list[tuple[int, float]]] = {}
    why = []
    ops = part.get("chunk_ops")
    if isinstance(ops, list) and ops:
        p = "" if ops[0] == "rowwise" or "rowwise" not in ops else "rowwise_"
    else:
        p = "rowwise_" if any(isinstance(row, dict) and "rowwise_one_forward" in row
                              for row in part.values()) else ""
    for context, b, row in _batch_rows(part):
        alone = _ms({"ms": row.get(f"{p}one_at_a_time")}) if isinstance(row, dict) else None
        batch = _ms({"ms": row.get(f"{p}one_forward")}) if isinstance(row, dict) else None
        if alone is None or batch is None:
            why.append(f"{context}x{b}: no {p}one_at_a_time and {p}one_forward ms")
        elif row.get(f"{p}exact") is not True:
            why.append(f"{context}x{b}: the batched chunks were not bit-exact")
        else:
            out.setdefault(context, []).append((b, batch / alone))
    return out, why


def _eager_rows(part: dict) -> tuple[dict, list[str]]:
    """batch_ratios of a `read` part: ({context: [(B, ratio)]}, why rows were left out)."""
    skipped, why = set(), []
    for key, row in part.items():
        m = re.fullmatch(r"(\d+)_exact", key)
        if m and isinstance(row, dict):
            if row.get("batches") is False:
                skipped.add(int(m[1]))
                why.append(f"{m[1]}: the adapter did not batch")
            elif row.get("exact") is False:
                skipped.add(int(m[1]))
                why.append(f"{m[1]}: the batched states were not bit-exact")
    out: dict[int, list[tuple[int, float]]] = {}
    for context, b, row in _batch_rows(part):
        if context in skipped:
            continue
        alone = _ms(row.get("bi_alone")) if isinstance(row, dict) else None
        batch = _ms(row.get("bi_batch")) if isinstance(row, dict) else None
        if alone is None or batch is None:
            why.append(f"{context}x{b}: no bi_alone and bi_batch ms")
            continue
        out.setdefault(context, []).append((b, batch / alone))
    return out, why


def _between(points: list[tuple[float, float]], x: float) -> float:
    """Linear interpolation through points (x ascending), the end values outside."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def batched_costs(bench: dict, ms_per_1k, grid: int) -> ChunkMs:
    """The measured batched read as a ChunkMs: a forward of B chunks at contexts cs (ids)
    costs one_at_a_time(ms_per_1k, grid)(cs) (ms, the measured cost model `fresh` uses) times
    r(B, mean(cs)), r = one forward's ms over one at a time's of `python -m evals.bi_bench
    --parts chunks` (or `read`; batch_ratios). r is linear in B between the measured batch
    sizes (1 at B = 1, the largest measured B's beyond it) and linear in the context between
    the measured contexts (the nearest one's outside them). ValueError as batch_ratios says."""
    curves = batch_ratios(bench, grid)
    base = one_at_a_time(ms_per_1k, grid)
    by_context = list(curves.items())

    def chunk_ms(contexts: Sequence[int]) -> float:
        ms = base(contexts)
        if len(contexts) < 2:
            return ms
        b, mean = len(contexts), sum(contexts) / len(contexts)
        at = [(c, _between([(1, 1.0)] + rows, b)) for c, rows in by_context]
        return ms * _between(at, mean)
    return chunk_ms


def span_s(requests: list[Request]) -> float:
    """From the first request's start to the last end (s)."""
    return max(r.end_s for r in requests) - requests[0].start_s


def overlay(timelines: list[list[Request]], cfg: OverlayConfig,
            rotation: int = 0) -> list[list[Request]]:
    """Each agent's requests (times moved, sessions renamed `a{i}:`), agent i replaying
    timelines[(rotation + i) % k]; see the module docstring."""
    k = len(timelines)
    base = timelines[rotation % k]
    window_s = span_s(base) if cfg.window_s is None else cfg.window_s
    rng = random.Random(f"{cfg.seed}:{cfg.num_agents}:{rotation}")
    agents = []
    for i in range(cfg.num_agents):
        reqs = timelines[(rotation + i) % k]
        shift_s = base[0].start_s - reqs[0].start_s + (rng.uniform(0, window_s) if i else 0.0)
        agents.append([replace(r, session=f"a{i}:{r.session}", start_s=r.start_s + shift_s,
                               first_token_s=r.first_token_s + shift_s,
                               end_s=r.end_s + shift_s) for r in reqs])
    return agents


class OverlayReader(SimReader):
    """SimReader whose chunk costs come from `chunk_ms` (one chunk a forward), logging each
    chunk as (start s, end s, window, session) with the window the engine says it reads in,
    and each forward as (ms, chunks) in `forwards`."""

    def __init__(self, clock, grid: int, chunk_ms: ChunkMs):
        super().__init__(clock, grid, None)
        self.chunk_ms, self.window, self.reads, self.forwards = chunk_ms, "idle", [], []

    def read_chunk(self, s: str) -> float:
        ms = self.chunk_ms((self.c[s],))
        self.c[s] += self.grid
        t0 = self.clock.t
        self.clock.t += ms / 1e3
        self.reads.append((t0, self.clock.t, self.window, s))
        self.forwards.append((ms, 1))
        return ms

    def read_chunks(self, sessions: list[str]) -> tuple[float, list[str]]:
        """One chunk of each in one forward (SHADOW_BATCH_SESSIONS > 1), costing
        `chunk_ms` of their contexts; each chunk logged over the forward's time."""
        ms = self.chunk_ms(tuple(self.c[s] for s in sessions))
        t0 = self.clock.t
        self.clock.t += ms / 1e3
        for s in sessions:
            self.c[s] += self.grid
            self.reads.append((t0, self.clock.t, self.window, s))
        self.forwards.append((ms, len(sessions)))
        return ms, list(sessions)


@dataclass
class _Live:
    """A request the host runs. work_s: its own recorded clock, which moves with the virtual
    clock during prefill and at 1 / stretch of it during decode."""

    agent: int
    req: Request
    admitted_s: float
    work_s: float
    decoding: bool = False
    produced: int = 0
    stretched_s: float = 0.0


@dataclass
class _Agent:
    requests: list[Request]
    next: int = 0
    lag_s: float = 0.0                 # what its finished requests were stretched by
    live: _Live | None = None

    def due_s(self) -> float:
        """When its next request starts (inf while one runs or none is left)."""
        if self.live is not None or self.next >= len(self.requests):
            return math.inf
        return self.requests[self.next].start_s + self.lag_s


@dataclass
class _Engine:
    run: _Run
    budget: StepBudget
    model: EngineModel
    agents: list[_Agent]
    live: list[_Live] = field(default_factory=list)
    last_s: float = 0.0                # the work clocks have moved up to here
    trace: list = field(default_factory=list)
    waits_ms: list = field(default_factory=list)
    requests_s: list = field(default_factory=list)       # (admitted, finished) a request
    decode_ms: float = 0.0             # time some request decodes
    busy_s: float = 0.0                # time some request runs
    batch_s: float = 0.0               # the integral of the number running

    @property
    def clock(self) -> VirtualClock:
        return self.run.clock


def _advance(e: _Engine, to_s: float) -> None:
    """Move the clock to at least to_s, the live requests' work clocks with it."""
    e.clock.t = max(e.clock.t, to_s)
    dt = e.clock.t - e.last_s
    stretch = e.model.stretch(len(e.live))
    for q in e.live:
        step = dt / stretch if q.decoding else dt
        q.work_s += step
        q.stretched_s += dt - step
    if e.live:
        e.busy_s += dt
        e.batch_s += dt * len(e.live)
        if any(q.decoding for q in e.live):
            e.decode_ms += dt * 1e3
    e.last_s = e.clock.t


def _event_s(e: _Engine, q: _Live) -> float:
    """When q's next event (first token, end) comes at today's batch."""
    if not q.decoding:
        return e.clock.t + max(0.0, q.req.first_token_s - q.work_s)
    return e.clock.t + max(0.0, q.req.end_s - q.work_s) * e.model.stretch(len(e.live))


def _admit(e: _Engine, i: int) -> None:
    agent = e.agents[i]
    src = agent.requests[agent.next]
    r = replace(src, start_s=src.start_s + agent.lag_s,
                first_token_s=src.first_token_s + agent.lag_s, end_s=src.end_s + agent.lag_s)
    reader = e.run.reader
    held = reader.ids.get(r.session, 0)
    e.trace.append((r.session, r.start_s, max(0, held - reader.c.get(r.session, 0))))
    reader.prompt(r.session, r.prompt_tokens)
    e.run.busy[0] = True
    e.run.sched.turn_started(r.session)
    agent.live = _Live(i, r, e.clock.t, e.clock.t)
    e.live.append(agent.live)


def _admit_due(e: _Engine) -> None:
    due = sorted((a.due_s(), i) for i, a in enumerate(e.agents))
    for t, i in due:
        if t <= e.clock.t:
            _admit(e, i)


def _emit(e: _Engine, q: _Live) -> None:
    """The output ids due by q's work clock (all of them once it ended)."""
    r = q.req
    span = max(r.end_s - r.first_token_s, 1e-9)
    due = r.output_tokens if q.work_s >= r.end_s else int(
        r.output_tokens * (q.work_s - r.first_token_s) / span)
    e.run.reader.ids[r.session] += due - q.produced
    q.produced = due


def _finish(e: _Engine, q: _Live) -> bool:
    """q ended: its last ids, the turn closed. Returns turn_finished's answer."""
    r = q.req
    e.run.reader.ids[r.session] += r.output_tokens - q.produced
    e.live.remove(q)
    agent = e.agents[q.agent]
    agent.live, agent.next = None, agent.next + 1
    agent.lag_s += q.stretched_s
    e.requests_s.append((q.admitted_s, e.clock.t))
    e.run.busy[0] = bool(e.live)
    return e.run.sched.turn_finished(r.session)


def _round(e: _Engine) -> None:
    """round_s of decode, then the step's slot (StepBudget: one session, in turn)."""
    e.budget.step_begins()
    _advance(e, e.clock.t + e.model.round_s)
    decoding = [q for q in e.live if q.decoding]
    for q in decoding:
        _emit(e, q)
    session = e.budget.next_session([q.req.session for q in decoding])
    if session is not None:
        e.run.reader.window = "ration"
        e.budget.charge(e.run.sched.between_rounds(session).ms)
        _advance(e, e.clock.t)
    e.budget.step_ends()


def _events(e: _Engine, at_s: float, woken: bool) -> bool:
    """Move to at_s; first tokens, ends and admissions due there. Returns woken."""
    _advance(e, at_s)
    for q in list(e.live):
        if not q.decoding and q.work_s >= q.req.first_token_s:
            q.decoding = True
            e.run.sched.output(q.req.session)
        if q.decoding and q.work_s >= q.req.end_s:
            woken = _finish(e, q)
    _admit_due(e)
    return woken


def _gap(e: _Engine, due_s: float, woken: bool) -> None:
    """No request runs: the idle window until the next one is due, then admit it."""
    run = e.run
    run.next_start[0] = due_s
    free_s = max(e.clock.t, due_s)
    run.reader.window = "idle"
    _idle_until(run, due_s, woken)
    if e.clock.t > free_s:
        e.waits_ms.append((e.clock.t - free_s) * 1e3)
    e.clock.t = max(e.clock.t, due_s)
    e.last_s = e.clock.t
    _admit_due(e)
    run.next_start[0] = math.inf


def _drive(e: _Engine) -> None:
    woken = False
    while True:
        due_s = min(a.due_s() for a in e.agents)
        if not e.live:
            if due_s == math.inf:
                return
            _gap(e, due_s, woken)
            woken = False
            continue
        at_s = min([due_s] + [_event_s(e, q) for q in e.live])
        if any(q.decoding for q in e.live) and e.clock.t + e.model.round_s < at_s:
            _round(e)
        else:
            woken = _events(e, at_s, woken)


def simulate_agents(agents: list[list[Request]], cfg: SchedulerConfig, ms_per_1k,
                    model: EngineModel = EngineModel(), chunk_ms: ChunkMs | None = None) -> dict:
    """One overlay (each agent's requests, as `overlay` gives them) through one scheduler.

    `ms_per_1k(context)`: the measured cost model (the scheduler's first estimate); chunk_ms:
    the batched-read hook (default: one_at_a_time). Returns fresh_share, backlog_p50,
    backlog_p90 (ids), host_share (the slot's ms over the ms some request decodes), ration_ms,
    decode_ms, batch_mean (requests running, averaged over the time some runs; busy_s and
    batch_s, its parts: the time some runs and the integral of the number running), `trace`: per
    turn (session, start s, backlog ids), host_waits_ms, `requests_s`: each request's
    (admitted, finished) s, `reads`: each chunk (start s, end s, "idle" or "ration",
    session), `forwards`: each forward of the shadow (ms, chunks)."""
    t0 = min((a[0].start_s for a in agents if a), default=0.0)
    clock = VirtualClock(t0)
    reader = OverlayReader(clock, cfg.grid, chunk_ms or one_at_a_time(ms_per_1k, cfg.grid))
    busy, next_start = [False], [math.inf]
    sched = Scheduler(cfg, reader, clock, lambda: busy[0] or clock.t >= next_start[0],
                      CostModel(ms_per_1k(0), cfg.grid))
    budget = StepBudget(cfg.share, clock, cfg.slice_ms)         # the engine's, as embedded's
    e = _Engine(_Run(clock, reader, sched, busy, next_start), budget,
                model, [_Agent(a) for a in agents], last_s=t0)
    _drive(e)
    backlogs = [b for *_, b in e.trace]
    return {"fresh_share": sum(b < cfg.grid for b in backlogs) / max(len(backlogs), 1),
            "backlog_p50": percentile(backlogs, 0.5), "backlog_p90": percentile(backlogs, 0.9),
            "host_share": e.budget.slot_ms / max(e.decode_ms, 1e-9),
            "ration_ms": e.budget.slot_ms, "decode_ms": e.decode_ms,
            "batch_mean": e.batch_s / max(e.busy_s, 1e-9), "busy_s": e.busy_s,
            "batch_s": e.batch_s, "trace": e.trace,
            "host_waits_ms": e.waits_ms, "requests_s": e.requests_s, "reads": reader.reads,
            "forwards": reader.forwards}


def agents_report(paths: list[str], num_agents: list[int], cfg: SchedulerConfig, cost_name: str,
                  ms_per_1k, model: EngineModel = EngineModel(), seed: int = 0,
                  window_s: float | None = None, chunk_ms: ChunkMs | None = None,
                  costs: str = ONE_AT_A_TIME) -> dict:
    """Per N in num_agents: the k rotations of the overlay pooled (module docstring). costs:
    what chunk_ms is, said in the report's "simulation" (default: one at a time)."""
    timelines = [load_timeline(p) for p in paths]
    names = [Path(p).stem for p in paths]
    out = {}
    for n in num_agents:
        ocfg = OverlayConfig(n, seed, window_s)
        runs = [simulate_agents(overlay(timelines, ocfg, j), cfg, ms_per_1k, model, chunk_ms)
                for j in range(len(timelines))]
        out[str(n)] = _pooled(runs, names, n, cfg.grid)
    return {"by_agents": out, "timelines": names,
            "reused": [n for n in num_agents if n > len(paths)],
            "seed": seed, "window_s": window_s, "cost_model": cost_name,
            "engine": {"decode_alpha": model.decode_alpha, "round_s": model.round_s},
            "scheduler": dataclasses.asdict(cfg), "date": date.today().isoformat(),
            "versions": _versions(), "simulation": costs}


def _pooled(runs: list[dict], names: list[str], n: int, grid: int) -> dict:
    """The rotations' turns together; the three sessions (a timeline's session, in whichever
    rotation and agent) furthest behind at a turn start; the shadow's forwards (idle and
    ration): how many, their mean ms and mean chunks."""
    backlogs = [b for r in runs for *_, b in r["trace"]]
    worst: dict[tuple, tuple] = {}            # (timeline, session) -> (backlog, -j, -i)
    for j, r in enumerate(runs):
        for session, _, b in r["trace"]:
            agent, name = session.split(":", 1)
            i = int(agent[1:])
            key = (names[(j + i) % len(names)], name)
            worst[key] = max(worst.get(key, (-1, 0, 0)), (b, -j, -i))
    top = sorted(((b, -neg_j, -neg_i, t, s) for (t, s), (b, neg_j, neg_i) in worst.items()),
                 key=lambda w: (-w[0], w[3], w[4]))[:3]
    ration = sum(r["ration_ms"] for r in runs)
    decode = sum(r["decode_ms"] for r in runs)
    forwards = [f for r in runs for f in r["forwards"]]
    return {"num_agents": n, "turns": len(backlogs),
            "fresh_share": round(sum(b < grid for b in backlogs) / max(len(backlogs), 1), 4),
            "backlog_p50": percentile(backlogs, 0.5), "backlog_p90": percentile(backlogs, 0.9),
            "host_share": round(ration / max(decode, 1e-9), 5),
            "batch_mean": round(sum(r["batch_s"] for r in runs)
                                / max(sum(r["busy_s"] for r in runs), 1e-9), 2),
            "num_forwards": len(forwards),
            "forward_ms_mean": round(sum(ms for ms, _ in forwards) / max(len(forwards), 1), 3),
            "chunks_per_forward": round(sum(n for _, n in forwards) / max(len(forwards), 1),
                                        3),
            "furthest_behind": [{"rotation": j, "agent": i, "timeline": t, "session": s,
                                 "backlog": b} for b, j, i, t, s in top]}


def _versions() -> dict:
    try:
        own = metadata.version("shadow-reader")
    except metadata.PackageNotFoundError:
        own = "not installed"
    return {"shadow_reader": own, "python": platform.python_version()}


def table(res: dict) -> str:
    """The report as a Markdown table, one row an N."""
    rows = ["| agents | turns | fresh | backlog p50 / p90 (ids) | host share | mean batch | "
            "shadow forward: ms (chunks) | furthest behind (ids) |",
            "| ---: | ---: | ---: | --- | ---: | ---: | --- | --- |"]
    for n, r in res["by_agents"].items():
        behind = ", ".join(f"{w['timeline']}#{w['agent']} {w['session'][:12]} {w['backlog']}"
                           for w in r["furthest_behind"])
        forwards = f"{r['forward_ms_mean']:.2f} ({r['chunks_per_forward']:.2f})" \
            if r["num_forwards"] else "none"
        rows.append(f"| {n} | {r['turns']} | {r['fresh_share']:.1%} | {r['backlog_p50']} / "
                    f"{r['backlog_p90']} | {r['host_share']:.2%} | {r['batch_mean']} | "
                    f"{forwards} | {behind} |")
    return "\n".join(rows)
