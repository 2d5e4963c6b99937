"""What memory forgets, written to disk from a CUDA device (skipped without one): the copies
off the device are begun without waiting for it, and the files hold the device's bits."""
import random

import pytest
import torch

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device")


@cuda
def test_copy_off_does_not_wait_for_the_device_and_copies_its_bits():
    from block_store.spill import copy_off
    x = torch.randn(1 << 20, device="cuda")
    y = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    # the first copies of a size allocate page-locked memory (cudaHostAlloc, which may wait for
    # the device); later ones reuse it from torch's caching host allocator, as a serving
    # process's evictions do after the first few
    warm, ready = copy_off([x, y])
    ready.synchronize()
    del warm
    # the kernels launched after the sleep loaded first: with lazy module loading (CUDA's
    # default) a kernel's first launch loads its module, which waits for the device; on the
    # H100 (2026-12-07) the first mul_ after the sleep waited for it, and the copies' event
    # was done before it was asked
    x.mul_(1.0)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))                  # about a second of the device queued first
    x.mul_(3.0)                                  # ... then the values the copies must see
    queued = torch.cuda.Event()
    queued.record()
    assert not queued.query(), "the device's sleep ended before copy_off was called"
    (hx, hy), ready = copy_off([x, y])
    assert ready is not None
    assert not ready.query(), ("the copies' event was done when copy_off returned; the sleep "
                               f"queued before them: {'done' if queued.query() else 'running'}")
    assert hx.is_pinned() and hy.is_pinned() and hy.dtype == torch.bfloat16
    ready.synchronize()
    assert torch.equal(hx, x.cpu()) and torch.equal(hy, y.cpu())
    cpu = torch.ones(3)
    (same,), none = copy_off([cpu])
    assert same is cpu and none is None
    (copied,), _ = copy_off([cpu], always_copy=True)
    assert copied is not cpu and torch.equal(copied, cpu)


@cuda
def test_a_cuda_reader_writes_what_it_forgets_with_the_device_bits(tmp_path):
    """A reader on CUDA with a disk folder: a GDN entry and a page handed to the spill (what
    an eviction does) are written while the device still runs, and the files hold the
    device's bits; the session stays exact."""
    from adapters.model import load_model
    from shadow_plugin.reader.reader import Reader
    model = load_model("random:qwen3.5-0.8b", device="cuda")
    rng = random.Random(0)
    ids = [rng.randrange(1000, 100000) for _ in range(3 * 512 + 100)]
    r = Reader(model, grid=512, disk_dir=tmp_path, cuda_graphs=False)
    r.feed("s", ids, "prompt")
    r.read("s")
    store = r.table.store
    entry = next(e for e in store.gdn.entries.values() if e.line == 3 * 512)
    page = r.table.resident["s"].pages[1]
    torch.cuda._sleep(int(1e9))                  # the device busy while the spill copies
    store.spill.entry(entry)
    store.spill.page(page)
    store.spill.flush()
    line, states, kind = store.disk.read_entry(entry.key)
    assert line == entry.line and len(states) == len(entry.states)
    assert all(torch.equal(c, c0.cpu()) and torch.equal(x, x0.cpu())
               for (c, x), (c0, x0) in zip(states, entry.states))
    rows = store.disk.read_page(page.key, page.ids)
    assert torch.equal(rows.cpu(), store.pool.block[:, :, page.index].cpu())
    assert r.check_exact("s")
    r.close()
