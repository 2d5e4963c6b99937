"""Spill and restore times of one session at 10k, 50k and 100k ids (issue 4), and a restore
in a second process that reads further and checks exactness.

    python -m evals.store_bench --ids .devdata/claudecode_vsla_5f8cbb78.npz \
        --more .devdata/claudecode_vsla_9034225e_seg2.npz --disk /tmp/shadow-disk

One session is read from 0; at each size it is parked (GPU -> safetensors file: copy to host,
checksums, write, fsync, rename) and brought back (file -> GPU: read from the warm page cache,
checksums, copy to the device), timed with a device sync, and compared bit for bit with the state
before the spill. Prints a table and, last, one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

from adapters.model import autotune, load_model
from shadow_plugin.reader import Reader

SECOND = """
import json, sys, numpy as np
from adapters.model import load_model
from shadow_plugin.reader import Reader
r = Reader(load_model(sys.argv[1], device=sys.argv[4]), grid=512, resident_bytes=0, disk_dir=sys.argv[2])
extra = np.load(sys.argv[3])["ids"][:4096].tolist()
r.feed("s", r.ids("s") + extra, "prompt")
r.read("s")
print(json.dumps({"second_process_committed": r.committed("s"),
                  "second_process_exact": r.check_exact("s"),
                  "second_process_restores": r.stats()["restores"]}))
"""


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn):
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return out, (time.perf_counter() - t0) * 1e3


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
    reader = Reader(model, grid=512, resident_bytes=2**40, disk_dir=args.disk)
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    res = {"gpu": gpu, "torch": torch.__version__, "model": args.model,
           "dtype": str(model.dtype).removeprefix("torch."), "date": time.strftime("%Y-%m-%d"),
           "sizes": []}
    print(f"{'ids':>7} {'file MB':>8} {'spill ms':>9} {'restore ms':>11} {'bitwise':>8}")
    for size in (int(s) for s in args.sizes.split(",")):
        reader.feed("s", ids[:size], "prompt")
        reader.read("s")
        before = {k: v.clone() for k, v in reader.state_tensors("s").items()}
        table = reader.table
        _, spill_ms = timed(lambda: table.residency.park(table.resident, "s"))
        nbytes = reader.stats()["disk_bytes"]
        _, restore_ms = timed(lambda: table.get("s"))
        after = reader.state_tensors("s")
        same = all(torch.equal(before[k], after[k]) for k in before)
        row = {"num_ids": size, "file_bytes": nbytes, "spill_ms": round(spill_ms, 1),
               "restore_ms": round(restore_ms, 1), "bitwise": same}
        res["sizes"].append(row)
        print(f"{size:>7} {nbytes / 1e6:>8.1f} {spill_ms:>9.1f} {restore_ms:>11.1f} {same!s:>8}",
              flush=True)
        del before, after
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
