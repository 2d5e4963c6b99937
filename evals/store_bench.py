"""Spill and restore times of one session at 10k, 50k and 100k ids (issues 4 and 16), and a
second process on the same disk folder that restores the session, reads further, and starts a
new session with the same prefix (found by key on disk), each checked for exactness.

    python -m evals.store_bench --ids .devdata/claudecode_vsla_5f8cbb78.npz \
        --more .devdata/claudecode_vsla_9034225e_seg2.npz --disk /tmp/shadow-disk

One session is read from 0; at each size, into an empty folder, it is parked (every page, its
states at C and its checkpoints' entries written: GPU -> host in one copy, checksums, files
written in threads, fsync, rename; then the manifest): `spill_ms`. Memory then forgets it (the
cached pages and unreferenced GDN entries, as after eviction or in a new process), and it is
brought back from the disk (files read from the warm page cache in threads, checksums, one copy
to the device): `restore_ms`. Then 4,096 more ids are read and it is parked again: only the
new pages are written (`respill_ms`). Times with a device sync; the restored state is compared
bit for bit with the state before the spill. It is then parked and forgotten again, its page
files read ahead without the reader's lock (Reader.prefetch: what a turn's events do before
the lock) `prefetch_ms`, and restored from those rows (`restore_after_prefetch_ms`: what the
lock is held for), again bit for bit. Prints a table and, last, one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

from adapters.model import autotune, load_model
from evals.timing import wall_ms
from shadow_plugin.reader.reader import Reader

SECOND = """
import json, sys, numpy as np
from adapters.model import load_model
from shadow_plugin.reader.reader import Reader
r = Reader(load_model(sys.argv[1], device=sys.argv[4]), grid=512, resident_bytes=0,
           disk_dir=sys.argv[2])
extra = np.load(sys.argv[3])["ids"][:4096].tolist()
held, (_, c) = r.ids("s"), r.position("s")       # the first process's manifest: nothing loaded
r.feed("t", held[:c] + extra[:600], "prompt")    # another session with its prefix
out = {"second_process_new_session_resumed_at": r.committed("t"),
       "second_process_disk_hit_tokens": r.stats()["prefix_cache_hit_tokens"]["disk"]}
r.read("t")
out["second_process_new_session_exact"] = r.check_exact("t")
r.feed("s", held + extra, "prompt")
r.read("s")
out.update({"second_process_committed": r.committed("s"),
            "second_process_exact": r.check_exact("s"),
            "second_process_restores": r.stats()["restores"]})
print(json.dumps(out))
"""


def measure(reader: Reader, ids: list[int], size: int) -> dict:
    """Spill, restore from disk and re-spill of session 's' read to `size` ids."""
    reader.feed("s", ids[:size], "prompt")
    reader.read("s")
    before = {k: v.clone() for k, v in reader.state_tensors("s").items()}
    table = reader.table
    _, spill_ms = wall_ms(lambda: table.park("s"))
    nbytes = reader.stats()["disk_bytes"]
    table.forget_memory()                         # memory forgets it: restored from disk
    hits = table.counters.prefix_cache_hit_tokens["disk"]
    _, restore_ms = wall_ms(lambda: table.get("s"))
    from_disk = table.counters.prefix_cache_hit_tokens["disk"] - hits
    after = reader.state_tensors("s")
    same = all(torch.equal(before[k], after[k]) for k in before)
    # again, its pages read ahead first (without the lock, as a turn's events are): what the
    # restore under the lock is left with
    table.park("s")                               # its files are there: only the manifest
    table.forget_memory()
    num_ahead, prefetch_ms = wall_ms(lambda: reader.prefetch("s"))
    _, restore_ahead_ms = wall_ms(lambda: table.get("s"))
    after = reader.state_tensors("s")
    same = same and all(torch.equal(before[k], after[k]) for k in before)
    reader.feed("s", ids[:size + 4096], "prompt")
    reader.read("s")
    _, respill_ms = wall_ms(lambda: table.park("s"))
    return {"num_ids": size, "disk_bytes": nbytes, "spill_ms": round(spill_ms, 1),
            "restore_ms": round(restore_ms, 1), "restored_from_disk_tokens": from_disk,
            "prefetch_ms": round(prefetch_ms, 1), "prefetched_pages": num_ahead,
            "restore_after_prefetch_ms": round(restore_ahead_ms, 1),
            "respill_ms": round(respill_ms, 1), "bitwise": same}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ids", required=True)
    ap.add_argument("--more", required=True, help="ids to continue with past the first file")
    ap.add_argument("--disk", required=True)
    ap.add_argument("--model", default="random:qwen3.5-0.8b")
    ap.add_argument("--sizes", default="10240,51200,102400")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--fresh-caches", action="store_true",
                    help="the second process starts with an empty Triton cache and, unless "
                         "the picks are pinned (model.autotune, by default; fla's, and "
                         "inductor's in its cache there), an empty inductor cache: as on "
                         "another machine")
    args = ap.parse_args()
    ids = np.concatenate([np.load(args.ids)["ids"], np.load(args.more)["ids"]]).tolist()
    model = load_model(args.model, device=args.device)
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    res = {"gpu": gpu, "torch": torch.__version__, "model": args.model,
           "dtype": str(model.dtype).removeprefix("torch."), "date": time.strftime("%Y-%m-%d"),
           "sizes": []}
    print(f"{'ids':>7} {'disk MB':>8} {'spill ms':>9} {'restore ms':>11} {'read ahead':>11} "
          f"{'then restore':>13} {'respill ms':>11} {'bitwise':>8}")
    for size in (int(s) for s in args.sizes.split(",")):
        shutil.rmtree(args.disk, ignore_errors=True)
        reader = Reader(model, grid=512, resident_bytes=8 * 2**30, disk_dir=args.disk)
        row = measure(reader, ids, size)
        res["sizes"].append(row)
        print(f"{size:>7} {row['disk_bytes'] / 1e6:>8.1f} {row['spill_ms']:>9.1f} "
              f"{row['restore_ms']:>11.1f} {row['prefetch_ms']:>11.1f} "
              f"{row['restore_after_prefetch_ms']:>13.1f} {row['respill_ms']:>11.1f} "
              f"{row['bitwise']!s:>8}", flush=True)
    res["exact"] = reader.check_exact("s")
    reader.close()
    env = dict(os.environ)
    if args.fresh_caches:             # no Triton or inductor picks on disk from this process
        env["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-")
        # pinned (model.autotune: the default) keeps inductor's cache under the pinned folder
        pinned = autotune.env_dir() is not None and os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        env["TORCHINDUCTOR_CACHE_DIR"] = pinned or tempfile.mkdtemp(prefix="inductor-")
    out = subprocess.run([sys.executable, "-c", SECOND, args.model, args.disk, args.more,
                          args.device],
                         capture_output=True, text=True, env=env)
    lines = out.stdout.strip().splitlines()
    res.update(json.loads(lines[-1]) if out.returncode == 0 and lines else
               {"second_process_error": out.stderr[-2000:]})
    print(json.dumps(res))


if __name__ == "__main__":
    main()
