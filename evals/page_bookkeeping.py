"""The host's page bookkeeping a chunk (issue 16's target: at most 20 us a chunk): what
step.read_chunk does around the forward, on a 100k-id session of random:qwen3.5-0.8b's state
shapes (the pool on the CPU, no forward): take a page (allocate), build the sequence's page
list (PageStore.view), name and commit it (checkpoints.commit_chunk: its key, the pool's key
map, the counters). Median and p90 of the chunks' host times (perf_counter), 200 chunks after
20 of warm-up. Last line: one JSON object.

    python -m evals.page_bookkeeping
"""
from __future__ import annotations

import json
import random
import statistics
import time

import torch

from adapters.model.config import PRESETS, spec_for
from block_store.checkpoints import commit_chunk
from block_store.keys import identity_key
from block_store.pages import PageStore
from block_store.session import new_state
from evals.bench import versions

GRID, CHUNKS, WARM = 512, 200, 20


def main() -> int:
    cfg = PRESETS["qwen3.5-0.8b"]
    spec = spec_for(cfg, "cpu", torch.bfloat16)
    store = PageStore(spec, GRID, identity_key({"probe": 1}), 2**34, num_pages=CHUNKS + WARM + 8)
    st = new_state(spec)
    rng = random.Random(0)
    st.ids = [rng.randrange(1000, 240000) for _ in range((CHUNKS + WARM + 1) * GRID)]
    parts = {"allocate": [], "view": [], "commit": [], "total": []}
    for i in range(CHUNKS + WARM):
        t0 = time.perf_counter()
        page = store.allocate()
        t1 = time.perf_counter()
        store.view(st.pages, [page])
        t2 = time.perf_counter()
        commit_chunk(store, st, page, st.gdn, 6)
        t3 = time.perf_counter()
        if i >= WARM:
            for k, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
                parts[k].append(v * 1e6)
    out = {k: {"median_us": round(statistics.median(v), 2),
               "p90_us": round(sorted(v)[int(0.9 * len(v))], 2)} for k, v in parts.items()}
    print(out)
    print(json.dumps({"probe": "page_bookkeeping", "grid": GRID, "chunks": CHUNKS,
                      "session_ids": len(st.ids), **versions(), "results": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
