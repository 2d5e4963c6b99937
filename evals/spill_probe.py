"""What writing evicted pages and GDN entries to disk costs (block_store/spill.py, issue 16
item 6), on random:qwen3.5-0.8b's state shapes (no forward, no weights): a pool of `--pages`
pages of G = 512 rows, each filled and named, then released (cached); then as many
allocations, each reusing a cached page, timed on the caller's side (the page's rows copied
off the device and its write queued) with a disk and without; then the time until the writes
are on disk (flush). The same for `--entries` loose GDN entries evicted at once. The folder is
a temporary one under `--dir` (default the system's); last line: one JSON object.

    python -m evals.spill_probe [--device cpu|cuda] [--pages 64] [--entries 8] [--dir DIR]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from adapters.model.config import PRESETS, spec_for
from block_store.disk import DiskStore
from block_store.files import FileIdentity
from block_store.keys import identity_key, next_key
from block_store.layout import zero_gdn
from block_store.pages import PageStore

GRID = 512


def _store(spec, n: int, disk: DiskStore | None) -> tuple[PageStore, list]:
    """A store of n cached pages, each named by a key chain over random ids."""
    store = PageStore(spec, GRID, identity_key({"probe": 1}), 2**40, num_pages=n, disk=disk)
    store.pool.block.normal_()
    rng, key, pages = random.Random(0), identity_key({"probe": 1}), []
    for _ in range(n):
        ids = [rng.randrange(1000, 240000) for _ in range(GRID)]
        key = next_key(key, ids)
        page = store.allocate(grow=False)
        store.manager.name(page, key, ids)
        pages.append(page)
    store.release_pages(pages)
    return store, pages


def _reuse(store: PageStore, n: int) -> dict:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        store.allocate(grow=False)
        _sync(store)
        times.append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter()
    if store.spill is not None:
        store.spill.flush()
    return {"allocate_ms_median": round(statistics.median(times), 3),
            "allocate_ms_max": round(max(times), 3),
            "flush_ms": round((time.perf_counter() - t0) * 1e3, 1),
            "total_ms": round(sum(times) + (time.perf_counter() - t0) * 1e3, 1)}


def _sync(store: PageStore) -> None:
    if store.spec.device.type == "cuda":
        torch.cuda.synchronize()


def _evict(store: PageStore, n: int) -> dict:
    for i in range(n):
        states = [(c.normal_(), r.normal_()) for c, r in zero_gdn(store.spec)]
        store.gdn.release(store.gdn.put(bytes([i]) * 16, (i + 1) * GRID, states, "tip"))
    t0 = time.perf_counter()
    store.gdn.evict(0)
    _sync(store)
    t1 = time.perf_counter()
    if store.spill is not None:
        store.spill.flush()
    t2 = time.perf_counter()
    return {"evict_ms": round((t1 - t0) * 1e3, 1), "flush_ms": round((t2 - t1) * 1e3, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--pages", type=int, default=64)
    ap.add_argument("--entries", type=int, default=8)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args(argv)
    spec = spec_for(PRESETS["qwen3.5-0.8b"], a.device, torch.bfloat16)
    ident = FileIdentity("probe", "{}", GRID, "bfloat16", a.device, "probe")
    out = {}
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        for name, disk in (("no_disk", None), ("disk", DiskStore(Path(tmp), ident))):
            store, _ = _store(spec, a.pages, disk)
            out[name] = {"pages": _reuse(store, a.pages), "entries": _evict(store, a.entries)}
            if store.spill is not None:
                out[name]["written"] = vars(store.spill.counters)
        page_mb = store.pool.page_bytes / 2**20
        entry_mb = sum(c.nbytes + r.nbytes for c, r in zero_gdn(spec)) / 2**20
    print(out)
    print(json.dumps({"probe": "spill", "device": a.device, "grid": GRID, "pages": a.pages,
                      "entries": a.entries, "page_mb": round(page_mb, 2),
                      "entry_mb": round(entry_mb, 2), "torch": torch.__version__,
                      "results": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
