"""The disk tier's spill and restore, before and after page-locked copies and unsynced page
files, side by side in one run (issue 16's targets: a 100k-id session spilled in at most 1 s
and restored from disk, warm page cache, in at most 0.3 s).

    python -m evals.disk_ab --ids X.npz --more Y.npz --disk /tmp/shadow-ab [--size 102400]

One session is read to `--size` ids. Spill: every page, its states and entries written into an
emptied folder by disk_io.save_session, `before` (pageable host memory, every file fsynced: the
first version) and `after` (page-locked memory, page and entry files not fsynced, the manifest
fsynced), alternately, `--repeats` each. Restore: the session parked, then memory forgets its
pages and entries and disk_io.load_resume brings every page and the state back from disk,
`before` (pageable buffer) and `after` (page-locked), alternately. ms with a device sync;
medians. The session is then restored by the reader's own path and checked exact. Last line:
one JSON object.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time

import numpy as np
import torch

from adapters.model import load_model
from block_store.disk_io import load_resume, save_session
from block_store.pages import find_resume
from evals.store_bench import timed
from shadow_plugin.reader import Reader

VARIANTS = {"before": {"pinned": False, "durable": True}, "after": {"pinned": None,
                                                                    "durable": False}}


def spill_times(reader: Reader, disk, repeats: int) -> dict[str, list[float]]:
    st, store, out = reader.table.resident["s"], reader.table.store, {v: [] for v in VARIANTS}
    for _ in range(repeats):
        for name, v in VARIANTS.items():
            for sub in ("pages", "gdn"):
                shutil.rmtree(disk.root / sub)
                (disk.root / sub).mkdir()
            _, ms = timed(lambda: save_session(store, disk, "s", st, v["pinned"], v["durable"]))
            out[name].append(ms)
    return out


def restore_times(reader: Reader, ids: list[int], repeats: int) -> dict[str, list[float]]:
    table, out = reader.table, {v: [] for v in VARIANTS}
    table.residency.park(table.resident, "s")
    store = table.store
    for _ in range(repeats):
        for name, v in VARIANTS.items():
            store.manager.forget_cached()
            store.gdn.evict(0)
            res = find_resume(store, [], [], 0, ids, 0)
            assert res.num_disk_pages == len(ids) // store.grid, res.num_disk_pages
            _, ms = timed(lambda: load_resume(store, res, ids, v["pinned"]))
            out[name].append(ms)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ids", required=True)
    ap.add_argument("--more", required=True)
    ap.add_argument("--disk", required=True)
    ap.add_argument("--size", type=int, default=102400)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--model", default="random:qwen3.5-0.8b")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    ids = np.concatenate([np.load(args.ids)["ids"], np.load(args.more)["ids"]]).tolist()
    ids = ids[:args.size // 512 * 512]
    shutil.rmtree(args.disk, ignore_errors=True)
    reader = Reader(load_model(args.model, device=args.device), grid=512,
                    resident_bytes=8 * 2**30, disk_dir=args.disk)
    reader.feed("s", ids, "prompt")
    reader.read("s")
    disk = reader.table.store.disk
    res = {"probe": "disk_ab", "model": args.model, "num_ids": len(ids),
           "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
           "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "variants": VARIANTS}
    for what, times in (("spill", spill_times(reader, disk, args.repeats)),
                        ("restore", restore_times(reader, ids, args.repeats))):
        res[what] = {k: {"median_ms": round(statistics.median(v), 1),
                         "all_ms": [round(x, 1) for x in v]} for k, v in times.items()}
        print(what, res[what], flush=True)
    res["disk_bytes"] = disk.counts()["bytes"]
    res["exact"] = reader.check_exact("s")          # restored by the reader's own path
    print(json.dumps(res))


if __name__ == "__main__":
    main()
