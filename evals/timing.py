"""How the benches time a call, two ways by what they measure:
- `device_ms`: the device's time between the call's first and last kernel (CUDA events; a
  kernel-bound arm: a forward, a graph's replay);
- `wall_ms`: the clock from an idle device to an idle device again (the host's own work
  counted: a reader's ask, a spill, a restore).
Both take the clock (time.perf_counter) where there is no CUDA: a smoke run on the CPU.
"""
from __future__ import annotations

import bisect
import time

import torch


def device_ms(fn, cuda: bool | None = None) -> tuple[object, float]:
    """(fn(), its milliseconds by CUDA events) on CUDA, by the clock elsewhere. cuda: whether
    to time with events (default: whether torch sees a GPU; False for a CPU arm on a machine
    with one)."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    if not cuda:
        t0 = time.perf_counter()
        out = fn()
        return out, (time.perf_counter() - t0) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = fn()
    end.record()
    torch.cuda.synchronize()           # every stream: no work of fn's runs into the next call
    return out, start.elapsed_time(end)


def wall_ms(fn, cuda: bool | None = None) -> tuple[object, float]:
    """(fn(), its milliseconds by the clock), the device synchronized before and after (on
    CUDA: cuda as device_ms's)."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    return out, (time.perf_counter() - t0) * 1e3


def device_timeline(fn, iters: int = 3, top: int = 12, min_gap_us: float = 5.0) -> dict:
    """`--trace`: where a call's wall time goes on a GPU, from torch.profiler, after one
    warm-up; iters calls, each from an idle device to an idle device again (synchronized):
    - `wall_ms`, `device_busy_ms` (the union of the device's kernels and copies, graph
      replays' kernels included) and `device_idle_ms` (the rest: the host's own time that
      the device did not hide), per call;
    - `num_kernels` (kernels and copies a call) and `kernels`: the `top` kernels by device
      time, each {calls, us} per call;
    - `idle_by_op`: the idle gaps of at least min_gap_us cut where host events start or
      end, each piece charged to the innermost op or runtime call running over it
      (`aten::copy_`, `cudaGraphLaunch`; "-" where none ran: Python): the `top` as
      {pieces, us} per call (all of them add up to `device_idle_ms` but for gaps under
      min_gap_us).
    Which Python functions the host's time goes to is cProfile's job (batch_bench's
    `profile`): the profiler's Python frames (with_stack) never reached prof.events() on an
    H100 with torch 2.11+cu130, every piece "-" without the verbose setting
    (docs/batch-bench-ask-trace-h100-2026-12-07.log) and with it
    (docs/batch-bench-ask-profile-h100-2026-12-07.log). Off CUDA (a smoke run) the device
    is never busy: every call's time is idle."""
    from torch.profiler import ProfilerActivity, profile, record_function
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    fn()
    sync()
    with profile(activities=acts) as prof:
        for _ in range(iters):
            with record_function("device_timeline.call"):
                fn()
                sync()
    windows, busy, kernels, gaps = _split(prof.events(), min_gap_us)
    wall_us = sum(b - a for a, b in windows)
    busy_us = sum(_overlap(busy, w) for w in windows)
    per: dict[str, list[float]] = {}
    for us, op in gaps:
        per.setdefault(op, []).append(us)
    return {"wall_ms": round(wall_us / iters / 1e3, 3),
            "device_busy_ms": round(busy_us / iters / 1e3, 3),
            "device_idle_ms": round((wall_us - busy_us) / iters / 1e3, 3),
            # kernels and copies a call (0 on CUDA: the profiler saw no graph's kernels)
            "num_kernels": round(sum(n for n, _ in kernels.values()) / iters, 2),
            "kernels": _top(kernels, iters, top),
            "idle_by_op": _top({k: (len(v), sum(v)) for k, v in per.items()}, iters, top,
                               "pieces")}


def _split(events, min_gap_us: float):
    """(the calls' windows [(start_us, end_us)], the device's busy intervals merged, kernel
    name -> (calls, us), gaps [(us, innermost op)]) of one profile's events."""
    on_device = lambda e: str(e.device_type).endswith("CUDA")     # noqa: E731
    windows = sorted((e.time_range.start, e.time_range.end) for e in events
                     if e.name == "device_timeline.call" and not on_device(e))
    # kernels and copies; not the device's copies of record_function ranges (ours, or
    # torch.compile's "Torch-Compiled Region"), which span their first to last kernel
    device = [e for e in events if on_device(e) and not getattr(e, "is_user_annotation", False)]
    kernels: dict[str, tuple[int, float]] = {}
    for e in device:
        n, us = kernels.get(e.name[:120], (0, 0.0))
        kernels[e.name[:120]] = (n + 1, us + e.time_range.end - e.time_range.start)
    busy = _merged([(e.time_range.start, e.time_range.end) for e in device])
    host = sorted((e for e in events if not on_device(e)
                   and e.name != "device_timeline.call"),    # outer first at one start
                  key=lambda e: (e.time_range.start, -e.time_range.end))
    starts = [e.time_range.start for e in host]
    gaps = []
    for a, b in (g for w in windows for g in _idle(w, busy) if g[1] - g[0] >= min_gap_us):
        over = [e for e in host[:bisect.bisect_left(starts, b)] if e.time_range.end > a]
        gaps += _pieces(over, a, b)
    return windows, busy, kernels, gaps


def _pieces(over, a: float, b: float) -> list[tuple[float, str]]:
    """The gap [a, b) cut where the host events over it (sorted by start) start or end: each
    piece (us, the innermost op or runtime call running over it, "-" for none); a sweep, the
    events running kept in order of start (innermost last)."""
    cuts = sorted({a, b} | {t for e in over for t in (e.time_range.start, e.time_range.end)
                            if a < t < b})
    out, running, k = [], [], 0
    for p, q in zip(cuts, cuts[1:]):
        while k < len(over) and over[k].time_range.start <= p:
            running.append(over[k])
            k += 1
        running = [e for e in running if e.time_range.end > p]
        out.append((q - p, running[-1].name[:80] if running else "-"))
    return out


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intervals [(start, end)] merged where they overlap or touch, in order."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _overlap(merged: list[tuple[float, float]], window: tuple[float, float]) -> float:
    """How much of window the merged intervals cover."""
    return sum(max(0.0, min(b, window[1]) - max(a, window[0])) for a, b in merged)


def _idle(window: tuple[float, float], merged: list[tuple[float, float]]):
    """The parts of window that no merged interval covers, in order."""
    at = window[0]
    for a, b in merged:
        if b <= at or a >= window[1]:
            continue
        if a > at:
            yield (at, a)
        at = max(at, b)
    if at < window[1]:
        yield (at, window[1])


def _top(per: dict[str, tuple[int, float]], iters: int, top: int, count: str = "calls") -> dict:
    """The `top` names by time: {name: {count, us}}, per call of iters."""
    rows = sorted(per.items(), key=lambda kv: -kv[1][1])[:top]
    return {k: {count: round(n / iters, 2), "us": round(us / iters, 1)} for k, (n, us) in rows}
