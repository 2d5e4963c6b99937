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
    device time first (all of them: side_by_side compares two tables by name). CUDA only; the profiler adds host time, so event_ms here is not a timing."""
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
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            ms[short_name(e.name)] += e.device_time_total / 1e3 / calls
            count[short_name(e.name)] += 1
    return {"event_ms": round(a.elapsed_time(b) / calls, 3),
            "busy_ms": round(sum(ms.values()), 3),
            "num_kernels": sum(count.values()) // calls,
            "kernels": {k: [round(v, 4), count[k] // calls] for k, v in ms.most_common()}}


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
    return "\n".join(lines)
