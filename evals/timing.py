"""How the benches time a call, two ways by what they measure:
- `device_ms`: the device's time between the call's first and last kernel (CUDA events; a
  kernel-bound arm: a forward, a graph's replay);
- `wall_ms`: the clock from an idle device to an idle device again (the host's own work
  counted: a reader's ask, a spill, a restore).
Both take the clock (time.perf_counter) where there is no CUDA: a smoke run on the CPU.
"""
from __future__ import annotations

import bisect
import re
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


OUR_PACKAGES = ("shadow_plugin/", "adapters/", "block_store/")
_FRAME = re.compile(r"\(\d+\): ")           # a Python frame's event: "path(line): function"


def device_timeline(fn, iters: int = 3, top: int = 12, min_gap_us: float = 5.0) -> dict:
    """`--trace`: where a call's wall time goes on a GPU, from torch.profiler, after one
    warm-up; iters calls, each from an idle device to an idle device again (synchronized):
    - `wall_ms`, `device_busy_ms` (the union of the device's kernels and copies, graph
      replays' kernels included) and `device_idle_ms` (the rest: the host's own time that
      the device did not hide), per call, from a profile without Python stacks;
    - `num_kernels` (kernels and copies a call) and `kernels`: the `top` kernels by device
      time, each {calls, us} per call;
    - `idle_by_function`: from a second profile with Python stacks (which slow the host, so
      its gaps run longer than the first's; compare them with each other, not with
      `device_idle_ms`), each idle gap of at least min_gap_us cut where host events start
      or end, each piece charged to the innermost function of ours (OUR_PACKAGES) running
      over it, else to the innermost Python frame: the `top` as {pieces, us} per call;
    - `idle_by_op`: the first profile's idle gaps so cut, charged to the innermost op or
      runtime call (`aten::copy_`, `cudaGraphLaunch`; "-" where none ran: Python), which
      add up to `device_idle_ms` but for gaps under min_gap_us.
    Off CUDA (a smoke run) the device is never busy: every call's time is idle."""
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile, record_function
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    fn()
    sync()
    runs = []
    for with_stack in (False, True):
        # verbose: some torch builds leave the Python frames out of prof.events() without
        # it (pytorch/pytorch#100253); on the H100 with 2.11+cu130 (2026-12-07) every idle
        # piece read "-" without it (with it: not yet run there)
        config = _ExperimentalConfig(verbose=True) if with_stack else None
        with profile(activities=acts, with_stack=with_stack,
                     experimental_config=config) as prof:
            for _ in range(iters):
                with record_function("device_timeline.call"):
                    fn()
                    sync()
        runs.append(_split(prof.events(), min_gap_us))
    (windows, busy, kernels, plain_gaps), (_, _, _, stack_gaps) = runs
    wall_us = sum(b - a for a, b in windows)
    busy_us = sum(_overlap(busy, w) for w in windows)
    out = {"wall_ms": round(wall_us / iters / 1e3, 3),
           "device_busy_ms": round(busy_us / iters / 1e3, 3),
           "device_idle_ms": round((wall_us - busy_us) / iters / 1e3, 3),
           # kernels and copies a call (0 on CUDA: the profiler saw no graph's kernels)
           "num_kernels": round(sum(n for n, _ in kernels.values()) / iters, 2),
           "kernels": _top(kernels, iters, top)}
    for key, at, gaps in (("idle_by_function", 0, stack_gaps), ("idle_by_op", 1, plain_gaps)):
        per: dict[str, list[float]] = {}
        for gap in gaps:
            per.setdefault(gap[at + 1], []).append(gap[0])
        out[key] = _top({k: (len(v), sum(v)) for k, v in per.items()}, iters, top, "pieces")
    return out


def _split(events, min_gap_us: float):
    """(the calls' windows [(start_us, end_us)], the device's busy intervals merged, kernel
    name -> (calls, us), gaps [(us, innermost function of ours or Python frame, innermost
    op)]) of one profile's events."""
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


def _pieces(over, a: float, b: float) -> list[tuple[float, str, str]]:
    """The gap [a, b) cut where the host events over it (sorted by start) start or end: each
    piece (us, the innermost function of ours running over it, else the innermost Python
    frame; the innermost op or runtime call), "-" for none; a sweep, the events running
    kept in order of start (innermost last)."""
    cuts = sorted({a, b} | {t for e in over for t in (e.time_range.start, e.time_range.end)
                            if a < t < b})
    out, running, k = [], [], 0
    for p, q in zip(cuts, cuts[1:]):
        while k < len(over) and over[k].time_range.start <= p:
            running.append(over[k])
            k += 1
        running = [e for e in running if e.time_range.end > p]
        frames = [e for e in running if _FRAME.search(e.name)]
        ours = [e for e in frames if any(x in e.name for x in OUR_PACKAGES)]
        ops = [e for e in running if not _FRAME.search(e.name)]
        out.append((q - p, _short((ours or frames)[-1].name) if frames else "-",
                    ops[-1].name[:80] if ops else "-"))
    return out


def _short(frame: str) -> str:
    """A Python frame's name from its package on ('.../adapters/graphed.py(381): f' ->
    'adapters/graphed.py(381): f')."""
    for p in OUR_PACKAGES:
        if p in frame:
            return frame[frame.index(p):]
    return frame.rsplit("/", 1)[-1]


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
