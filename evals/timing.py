"""How the benches time a call, two ways by what they measure:
- `device_ms`: the device's time between the call's first and last kernel (CUDA events; a
  kernel-bound arm: a forward, a graph's replay);
- `wall_ms`: the clock from an idle device to an idle device again (the host's own work
  counted: a reader's ask, a spill, a restore).
Both take the clock (time.perf_counter) where there is no CUDA: a smoke run on the CPU.
"""
from __future__ import annotations

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
