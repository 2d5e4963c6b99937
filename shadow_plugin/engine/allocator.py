"""The CUDA caching allocator's device calls inside the serving engine's process, counted over
serving (docs/vllm.md).

The host and the shadow share one process and so one PyTorch caching allocator. When a tensor
finds no cached block the allocator asks the driver (cudaMalloc); when the driver has no
memory left it frees its cached blocks and asks again (an alloc retry), and cudaFree waits for
the whole device: the host's kernels in flight and the shadow's. Either is a stall that a
read or a step's start would show as host time, not as a wait for its own work. These
counters (torch.cuda.memory_stats: "num_alloc_retries", "num_device_alloc",
"num_device_free", "num_sync_all_streams") tell whether any came during serving.
"""
from __future__ import annotations

import torch

COUNTERS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams")


def device_counts(device: torch.device | None) -> dict[str, int]:
    """COUNTERS of the caching allocator on `device` now (a CUDA device; None or another
    kind: zeros), process-wide since its start; a counter this torch does not keep reads 0."""
    if device is None or device.type != "cuda" or not torch.cuda.is_initialized():
        return dict.fromkeys(COUNTERS, 0)
    stats = torch.cuda.memory_stats(device)
    return {k: int(stats.get(k, 0)) for k in COUNTERS}


class AllocatorCounters:
    """COUNTERS since `mark` (the shadow is up: serving), for status as
    cuda_<counter>: e.g. cuda_num_device_free, the cudaFree calls during serving, each a
    wait for the whole device. All 0 on the CPU and before mark."""

    def __init__(self):
        self.device: torch.device | None = None
        self.base = dict.fromkeys(COUNTERS, 0)

    def mark(self, device: torch.device | None) -> None:
        """Count from now on `device` (the shadow's; None: nothing is counted)."""
        self.device = device
        self.base = device_counts(device)

    def stats(self) -> dict[str, int]:
        """{"cuda_num_alloc_retries", "cuda_num_device_alloc", "cuda_num_device_free",
        "cuda_num_sync_all_streams"}: each counter's growth since mark."""
        now = device_counts(self.device)
        return {f"cuda_{k}": now[k] - self.base[k] for k in COUNTERS}
