"""A worker process of evals/pages_ab.py: one tree of the code, driven one JSON command a
line (evals/ab_worker.py answers)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


class Tree:
    """A worker process in `root` (its code first on the path), evals/ab_worker.py of this
    tree run by its path, with the run's model, device and grid (args: pages_ab's parsed
    arguments) and optionally small question bucket rows ('64,128', or 'none'). Calling it
    sends one command and returns the worker's JSON answer; RuntimeError when the worker
    stopped."""

    def __init__(self, root: Path, args, small_bucket_rows: str = ""):
        self.root = root
        env = {**os.environ, "PYTHONPATH": f"{root}:{os.environ.get('PYTHONPATH', '')}"}
        extra = ["--small-bucket-rows", small_bucket_rows] if small_bucket_rows else []
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve().with_name("ab_worker.py")),
             "--model", args.model, "--device", args.device, "--grid", str(args.grid), *extra],
            cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __call__(self, **cmd) -> dict:
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:                 # it stopped before (say while being built)
            line = ""
        else:
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker in {self.root} stopped on {cmd['op']} (its stderr "
                               "says why)")
        ans = json.loads(line)
        if "error" in ans:                                # which tree refused
            ans["error"] = f"{self.root}: {ans['error']}"
        return ans

    def close(self) -> None:
        """Ends the worker (its stdin closed) and waits for it, at most 60 s."""
        try:
            self.proc.stdin.close()
        except BrokenPipeError:                 # it had stopped already
            pass
        self.proc.wait(timeout=60)
