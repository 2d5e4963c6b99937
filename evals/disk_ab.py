"""The disk tier's restore, before and after reading page files straight into page-locked
memory, side by side in one run (issue 16's targets: a 100k-id session restored from disk,
warm page cache, in at most 0.3 s, and spilled in at most 1 s).

    python -m evals.disk_ab --ids X.npz --more Y.npz --disk /tmp/shadow-ab [--size 102400]
        [--repeats 6] [--threads 4,16]

One session is read to `--size` ids and spilled (disk_io.save_session: page-locked copies, page
and entry files not fsynced, the manifest fsynced) into an emptied folder `--repeats` times:
`spill` (the current path, for reference). Restore: the session parked, then memory forgets
its pages and entries and disk_io.load_resume brings every page and the state back from disk,
`before` (fast=False: safetensors reads each file into its own tensor, which is hashed and
copied into the group's page-locked buffer; the path of 11ae925) and `after` (fast=True:
page_read.read_page_into reads each file into the buffer, hashed by xxhash), both with
disk_io.IO_THREADS threads, then `after_ctypes` (the same, hashed through ctypes, which
releases the GIL whatever xxhash's version) and `after_tN` with N threads for each N of
`--threads`; in turns, one warm-up round first (it pays for locking host memory), `--repeats`
timed rounds. ms with a device sync; medians. Then one restore by each read: the pool's bits
compared; the session is restored by the reader's own path and checked exact. The JSON
records whether this xxhash releases the GIL while it hashes (what lets threads hash in
parallel). Last line: one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import threading
import time

import numpy as np
import torch
import xxhash

from adapters.model import load_model
from block_store import disk_io, page_read
from block_store.disk_io import load_resume, save_session
from block_store.pages import find_resume
from evals.store_bench import timed
from shadow_plugin.reader import Reader


def spill_times(reader: Reader, disk, repeats: int) -> list[float]:
    st, store, out = reader.table.resident["s"], reader.table.store, []
    for _ in range(repeats):
        for sub in ("pages", "gdn"):
            shutil.rmtree(disk.root / sub)
            (disk.root / sub).mkdir()
        out.append(timed(lambda: save_session(store, disk, "s", st))[1])
    return out


def restore(reader: Reader, ids: list[int], fast: bool, threads: int, hash_: str = "xxhash"):
    """Forget the session's pages and entries, load them from disk with `threads` threads
    (files hashed by `hash_`, page_read.HASHES); (Resume, ms)."""
    store = reader.table.store
    store.manager.forget_cached()
    store.gdn.evict(0)
    res = find_resume(store, [], [], 0, ids, 0)
    assert res.num_disk_pages == len(ids) // store.grid, res.num_disk_pages
    default = disk_io.IO_THREADS, page_read.HASH
    disk_io.IO_THREADS, page_read.HASH = threads, hash_
    try:
        got, ms = timed(lambda: load_resume(store, res, ids, fast=fast))
    finally:
        disk_io.IO_THREADS, page_read.HASH = default
    assert got is not None and got.num_loaded == len(ids) // store.grid
    return got, ms


def restore_times(reader: Reader, ids: list[int], variants: dict, repeats: int) -> dict:
    table, out = reader.table, {v: [] for v in variants}
    table.residency.park(table.resident, "s")
    for r in range(repeats + 1):                 # round 0: warm-up, not kept
        for name, v in variants.items():
            ms = restore(reader, ids, *v)[1]
            if r:
                out[name].append(ms)
    return out


def same_bits(reader: Reader, ids: list[int]) -> bool:
    """One restore by each read: the pool's rows of the session's pages compared."""
    block, got = reader.table.store.pool.block, []
    for fast in (False, True):
        res = restore(reader, ids, fast, disk_io.IO_THREADS)[0]
        idx = torch.tensor([p.index for p in res.pages], device=block.device)
        got.append(block.index_select(2, idx))
    return bool(torch.equal(*got))


def xxhash_releases_gil() -> dict:
    """Whether another thread runs while xxhash hashes 256 MB: the longest this thread was
    held up against the hash's time (GIL held: about the whole hash)."""
    buf, done, took = bytearray(256 << 20), threading.Event(), []

    def hash_it():
        t = time.perf_counter()
        xxhash.xxh3_64_hexdigest(buf)
        took.append(time.perf_counter() - t)
        done.set()
    th = threading.Thread(target=hash_it)
    last, gap = time.perf_counter(), 0.0
    th.start()
    while not done.is_set():
        now = time.perf_counter()
        gap, last = max(gap, now - last), now
    th.join()
    return {"releases": gap < took[0] / 2, "hash_ms": round(took[0] * 1e3, 1),
            "longest_wait_ms": round(gap * 1e3, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ids", required=True)
    ap.add_argument("--more", required=True)
    ap.add_argument("--disk", required=True)
    ap.add_argument("--size", type=int, default=102400)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--threads", default="4,16", help="more thread counts for the new read")
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
    n = disk_io.IO_THREADS
    variants = {"before": (False, n, "xxhash"), "after": (True, n, "xxhash"),
                "after_ctypes": (True, n, "ctypes"),
                **{f"after_t{t}": (True, int(t), "xxhash") for t in args.threads.split(",")
                   if t}}
    res = {"probe": "disk_ab", "model": args.model, "num_ids": len(ids),
           "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
           "torch": torch.__version__, "xxhash": xxhash.VERSION,
           "xxhash_gil": xxhash_releases_gil(), "ctypes_hash": page_read.xxh3_ctypes() is not None,
           "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "io_threads": n,
           "group_pages": disk_io.GROUP_PAGES,
           "variants": {k: {"fast": f, "threads": t, "hash": h}
                        for k, (f, t, h) in variants.items()}}
    times = spill_times(reader, disk, args.repeats)
    res["spill"] = {"median_ms": round(statistics.median(times), 1),
                    "all_ms": [round(x, 1) for x in times]}
    print("spill", res["spill"], flush=True)
    times = restore_times(reader, ids, variants, args.repeats)
    res["restore"] = {k: {"median_ms": round(statistics.median(v), 1),
                          "all_ms": [round(x, 1) for x in v]} for k, v in times.items()}
    print("restore", res["restore"], flush=True)
    res["same_bits"] = same_bits(reader, ids)
    res["disk_bytes"] = disk.counts()["bytes"]
    res["exact"] = reader.check_exact("s")          # restored by the reader's own path
    print(json.dumps(res))


if __name__ == "__main__":
    main()
