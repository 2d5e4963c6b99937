"""Where the GPU's time goes in one call, kernel by kernel (torch.profiler with CUPTI: kernels
inside CUDA graph replays are traced one by one), for side-by-side profiles of two trees
(evals/pages_ab.py).

    from evals.kernel_profile import kernel_table
    table = kernel_table(lambda: reader.read("s", max_chunks=1), calls=2)
"""
from __future__ import annotations

import collections
import re

import torch
from torch.profiler import ProfilerActivity, profile


def short_name(name: str, width: int = 70) -> str:
    """A kernel's name without template arguments and parameter lists, cut to `width`."""
    name = re.sub(r"<.*>", "<>", name)
    name = re.sub(r"\(.*\)", "", name)
    return name[:width]


def kernel_table(fn, calls: int = 2) -> dict:
    """Run fn `calls` times under the profiler (after one untraced call) and return, per call:
    event_ms (CUDA events around all calls, so idle gaps count), busy_ms (the kernels' summed
    device time), num_kernels, and kernels: {short name: [ms, count]} for every kernel, largest
    device time first (all of them: side_by_side compares two tables by name), and idle_gaps'
    figures. CUDA only; the profiler adds host time, so event_ms here is not a timing."""
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        torch.cuda.synchronize()
    ms = collections.Counter()
    count = collections.Counter()
    spans = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            ms[short_name(e.name)] += e.device_time_total / 1e3 / calls
            count[short_name(e.name)] += 1
            spans.append((e.time_range.start, e.time_range.end, short_name(e.name, 40)))
    return {"event_ms": round(a.elapsed_time(b) / calls, 3),
            "busy_ms": round(sum(ms.values()), 3),
            "num_kernels": sum(count.values()) // calls,
            "kernels": {k: [round(v, 4), count[k] // calls] for k, v in ms.most_common()},
            **idle_gaps(spans, calls)}


def idle_gaps(spans: list[tuple[float, float, str]], calls: int, top: int = 12) -> dict:
    """Where the GPU idles between kernels: spans (start_us, end_us, name) of the traced
    kernels -> idle_ms (time between one kernel's end, or the latest end so far, and the next
    kernel's start, summed over all spans, divided by `calls`: the gaps between calls, the
    host's time from one call's last kernel to the next one's first, count; the gap before
    the first call's first kernel is not seen), idle_before (that time by the kernel after
    the gap, ms a call, the 10 largest) and gaps_us (the `top` largest gaps: [us, kernel
    before, kernel after]; the gaps between calls are among them)."""
    spans = sorted(spans)
    gaps, by_next = [], collections.Counter()
    end, prev = None, ""
    for start, stop, name in spans:
        if end is not None and start > end:
            gaps.append((start - end, prev, name))
            by_next[name] += (start - end) / 1e3 / calls
        if end is None or stop > end:
            end, prev = stop, name
    return {"idle_ms": round(sum(g[0] for g in gaps) / 1e3 / calls, 4),
            "idle_before": {k: round(v, 4) for k, v in by_next.most_common(10)},
            "gaps_us": [[round(g[0], 1), g[1], g[2]] for g in sorted(gaps, reverse=True)[:top]]}


def side_by_side(a: dict, b: dict, width: int = 70, top: int = 24) -> str:
    """Two kernel_table results as text lines: name, A ms, B ms, B - A, for the `top` kernels
    of largest |B - A| over the union of both tables' names (a kernel one side lacks: 0)."""
    names = set(a["kernels"]) | set(b["kernels"])
    rows = sorted(names, key=lambda n: -abs(b["kernels"].get(n, [0])[0]
                                           - a["kernels"].get(n, [0])[0]))[:top]
    lines = [f"{'kernel':<{width}} {'A ms':>8} {'B ms':>8} {'B-A':>8}",
             f"{'(all kernels) busy / event':<{width}} {a['busy_ms']:>8.3f} {b['busy_ms']:>8.3f} "
             f"{b['busy_ms'] - a['busy_ms']:>8.3f}  event {a['event_ms']} / {b['event_ms']}, "
             f"kernels {a['num_kernels']} / {b['num_kernels']}"]
    for n in rows:
        x, y = a["kernels"].get(n, [0, 0]), b["kernels"].get(n, [0, 0])
        lines.append(f"{n:<{width}} {x[0]:>8.4f} {y[0]:>8.4f} {y[0] - x[0]:>8.4f}  "
                     f"({x[1]} / {y[1]} a call)")
    if "idle_ms" in a and "idle_ms" in b:
        lines.append(f"{'(idle between kernels, a call)':<{width}} {a['idle_ms']:>8.4f} "
                     f"{b['idle_ms']:>8.4f} {b['idle_ms'] - a['idle_ms']:>8.4f}")
        before = set(a["idle_before"]) | set(b["idle_before"])
        for n in sorted(before, key=lambda n: -abs(b["idle_before"].get(n, 0)
                                                  - a["idle_before"].get(n, 0))):
            x, y = a["idle_before"].get(n, 0), b["idle_before"].get(n, 0)
            lines.append(f"  idle before {n:<{width - 14}} {x:>8.4f} {y:>8.4f} {y - x:>8.4f}")
        for side, t in (("A", a), ("B", b)):
            lines.append(f"  {side}'s largest gaps (us, before, after): {t['gaps_us'][:8]}")
    return "\n".join(lines)
