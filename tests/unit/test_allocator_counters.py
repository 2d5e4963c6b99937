"""shadow_plugin.engine.allocator: the CUDA caching allocator's device calls over serving."""
import torch

from shadow_plugin.engine.allocator import COUNTERS, AllocatorCounters, device_counts


def test_the_cpu_counts_no_device_calls_and_status_names_each_counter():
    assert device_counts(None) == dict.fromkeys(COUNTERS, 0)
    assert device_counts(torch.device("cpu")) == dict.fromkeys(COUNTERS, 0)
    counters = AllocatorCounters()
    assert counters.stats() == {"cuda_num_alloc_retries": 0, "cuda_num_device_alloc": 0,
                             "cuda_num_device_free": 0, "cuda_num_sync_all_streams": 0}
    counters.mark(torch.device("cpu"))
    torch.ones(1 << 20).sum()
    assert set(counters.stats().values()) == {0}


def test_the_counts_are_the_growth_since_mark(monkeypatch):
    """On CUDA: each counter read again at stats, less what it was at mark."""
    import shadow_plugin.engine.allocator as allocator
    now = {"num_alloc_retries": 1, "num_device_alloc": 40, "num_device_free": 3,
           "num_sync_all_streams": 2}
    monkeypatch.setattr(allocator, "device_counts", lambda device: dict(now))
    counters = AllocatorCounters()
    counters.mark(torch.device("cuda", 0))
    now.update(num_device_alloc=45, num_device_free=5)
    assert counters.stats() == {"cuda_num_alloc_retries": 0, "cuda_num_device_alloc": 5,
                             "cuda_num_device_free": 2, "cuda_num_sync_all_streams": 0}
