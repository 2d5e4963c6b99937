"""block_store.spill.copy_off on the CPU: what the spill writes is a copy it may keep."""
import torch

from block_store.spill import copy_off


def test_cpu_tensors_are_kept_as_they_are_or_copied_when_asked_and_nothing_waits():
    a, b = torch.arange(6.0).view(2, 3), torch.ones(4, dtype=torch.bfloat16)
    (ka, kb), ready = copy_off([a, b])
    assert ka is a and kb is b and ready is None
    view = torch.arange(24.0).view(2, 3, 4)[:, 1]            # a page's rows: a strided view
    (rows,), ready = copy_off([view], always_copy=True, freed=False)
    assert ready is None and rows.is_contiguous() and torch.equal(rows, view)
    view.add_(1.0)                                            # the pool's memory reused
    assert not torch.equal(rows, view)


def test_a_writer_thread_is_bound_only_to_a_named_cuda_device(monkeypatch):
    from block_store import spill
    bound = []
    monkeypatch.setattr(spill.torch.cuda, "set_device", bound.append)
    spill.bind_device(torch.device("cpu"))
    spill.bind_device(torch.device("cuda"))        # the current device: nothing to set
    spill.bind_device(torch.device("cuda", 1))
    assert bound == [torch.device("cuda", 1)]
