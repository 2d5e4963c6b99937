"""Where a read's host time goes, and which of its calls wait for the device (issue 36).

Inside vLLM the longest read of a live follow spent most of its host part outside the adapter's
forward calls (docs/vllm.md, `read_max_forward_ms`). This follows recorded agents
(evals/vllm/agents.py's .npz) with one Reader on a device and no host, as the serving idle loop
reads them: each round feeds every agent's next prompt (its outputs before it: random ids,
`--output-ids` a turn, seeded), then `read_batch` over the sessions due until none has a chunk
due, up to `--batch` sessions' chunks a forward; with a disk folder (as SHADOW_DISK in the
trial: checkpoints past the cap are written). `--cases` runs, in order, each with a fresh
reader: `disk`; `no_disk` (nothing written); `disk_sync_copies` (the spill's copies off the
device made as before 2026-12-07, `.to("cpu")` in the reading thread: the old arm of an A/B).
Each read's parts: its ms, its forward calls (ReadResult.forward_ms), its final wait for the
device (sync_ms) and the rest, the reader's own bookkeeping, and the garbage collections during
it (timed as inside vLLM: shadow_plugin.engine.gc_pauses, the heap frozen after the warm-up).
`--sync-audit` turns on torch's sync debug mode (torch.cuda.set_sync_debug_mode("warn")) over
the feeds and the reads: every call that waits for the device and that the mode sees (not
torch.cuda.synchronize, so not a read's final wait) is counted by its call site (the innermost
frames inside this repository). `--profile` runs every read under cProfile and keeps the one
whose bookkeeping was the longest: its functions by cumulative time (cProfile's own cost lands
in every read, so its times are for finding where, not how long).

    python -m evals.read_syncs --model random:qwen3.5-0.8b --device cuda --sync-audit

The last line printed is one JSON object (machine, versions, date); figures go in
BENCHMARKS.md, nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import datetime
import gc
import json
import os
import platform
import pstats
import tempfile
import threading
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch

from adapters.model import load_model
from block_store import spill
from evals.run_info import git_commit
from evals.vllm import agents as agent_scripts
from shadow_plugin.engine.gc_pauses import GcPauses
from shadow_plugin.reader.reader import Reader

REPO = str(Path(__file__).resolve().parents[1])
CASES = ("disk", "no_disk", "disk_sync_copies")


def sync_site(stack: list[traceback.FrameSummary], depth: int = 3) -> str:
    """The innermost `depth` frames of `stack` inside this repository (evals/read_syncs.py
    left out), innermost first, as 'path:line function' joined by ' < '."""
    own = [f for f in reversed(stack) if f.filename.startswith(REPO + os.sep)
           and os.path.abspath(f.filename) != os.path.abspath(__file__)
           and not os.path.relpath(f.filename, REPO).startswith(".")]    # staged sites
    return " < ".join(f"{os.path.relpath(f.filename, REPO)}:{f.lineno} {f.name}"
                      for f in own[:depth]) or "(outside the repository)"


def follow(reader: Reader, scripts, args, audit: bool,
           profile: "LongestProfile | None" = None) -> tuple[list, collections.Counter]:
    """The agents followed round by round; returns every read's ReadResult and, with audit,
    the syncs by site, those inside the feeds (inside vLLM: the events thread's hold) keyed
    "feed", those inside the reads "read"; with `profile`, every read run under it."""
    rng = np.random.default_rng(args.seed)
    vocab = reader.adapter.vocab_size
    prompt = {s.name: list(s.first_prompt) for s in scripts}
    out_of: dict[str, list[int]] = {}          # each agent's last output
    results, syncs = [], collections.Counter()
    for turn in range(max(s.num_turns for s in scripts)):
        for s in scripts:
            if turn >= s.num_turns:
                continue
            if turn:                   # agents.prompts' rule, one turn at a time
                prompt[s.name] = list(s.rerender_prompt) if turn == s.rerender_turn else \
                    agent_scripts.next_prompt(prompt[s.name], out_of[s.name],
                                              s.suffixes[turn - 1])
            out_of[s.name] = rng.integers(0, vocab, args.output_ids).tolist()
            for ids, kind in ((prompt[s.name], "prompt"), (out_of[s.name], "output")):
                audited(audit, "feed", syncs, reader.feed, s.name, ids, kind)
        while True:
            due = [s.name for s in scripts
                   if reader.backlog(s.name) >= reader.config.grid]
            if not due:
                break
            read = reader.read_batch if profile is None else profile.wrap(reader.read_batch)
            results.append(audited(audit, "read", syncs, read, due[:args.batch]))
    return results, syncs


def audited(audit: bool, label: str, syncs: collections.Counter, fn, *args):
    """fn(*args); with audit, under torch's sync debug mode: each call that waits for the
    device and that the mode sees warns (not torch.cuda.synchronize nor Event.synchronize, so
    not the read's final wait), and the warning's hook (run at the call, in its thread) counts
    its site in syncs as "label, thread: site" (a spill's writer thread may warn too); other
    warnings are shown as usual. The mode is set back as it was."""
    if not audit:
        return fn(*args)
    shown = warnings.showwarning

    def hook(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return shown(message, category, filename, lineno, file, line)
        where = sync_site(traceback.extract_stack())
        syncs[f"{label}, {threading.current_thread().name}: {where}"] += 1
    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = hook
        torch.cuda.set_sync_debug_mode("warn")
        try:
            return fn(*args)
        finally:
            torch.cuda.set_sync_debug_mode(before)


class LongestProfile:
    """cProfile of each read wrapped, the one kept whose bookkeeping (bookkeeping_ms) was the
    longest; `top` lists its functions."""

    def __init__(self):
        self.bookkeeping_ms, self.index, self.num_reads = -1.0, None, 0
        self.profile: cProfile.Profile | None = None

    def wrap(self, read):
        """`read` (returning a ReadResult) run under a profiler of its own."""
        def profiled(*args):
            prof = cProfile.Profile()
            prof.enable()
            try:
                result = read(*args)
            finally:
                prof.disable()
            if result.num_chunks and bookkeeping_ms(result) > self.bookkeeping_ms:
                self.bookkeeping_ms, self.index = bookkeeping_ms(result), self.num_reads
                self.profile = prof
            self.num_reads += 1
            return result
        return profiled

    def top(self, num_functions: int = 30) -> dict:
        """The kept read's index among the reads, its bookkeeping (ms) and its functions of the
        longest cumulative time, at most num_functions, each {"fn": "path:line name" (paths
        inside this repository relative to it), "num_calls", "tottime_ms", "cumtime_ms"}
        (read_index and bookkeeping_ms None, no functions, when no read was kept)."""
        if self.profile is None:
            return {"read_index": None, "bookkeeping_ms": None, "functions": []}
        stats = pstats.Stats(self.profile).stats       # (file, line, name): (cc, nc, tt, ct, ..)
        rows = sorted(stats.items(), key=lambda kv: -kv[1][3])[:num_functions]

        def where(file, line, name):
            if file.startswith(REPO + os.sep):
                file = os.path.relpath(file, REPO)
            return f"{file}:{line} {name}"
        return {"read_index": self.index, "bookkeeping_ms": round(self.bookkeeping_ms, 3),
                "functions": [{"fn": where(*key), "num_calls": v[1], "tottime_ms":
                               round(v[2] * 1e3, 3), "cumtime_ms": round(v[3] * 1e3, 3)}
                              for key, v in rows]}


def bookkeeping_ms(r) -> float:
    """A ReadResult's ms outside its forward calls and its final wait for the device."""
    return r.ms - r.sync_ms - r.forward_ms


def parts(results: list) -> dict:
    """The reads' totals, and the longest read's and the longest bookkeeping's parts (ms;
    read_index: its index in `results`)."""
    def split(i: int) -> dict:
        r = results[i]
        return {"read_index": i, "ms": round(r.ms, 3), "num_chunks": r.num_chunks,
                "forward_ms": round(r.forward_ms, 3), "sync_ms": round(r.sync_ms, 3),
                "bookkeeping_ms": round(bookkeeping_ms(r), 3), "gc_ms": round(r.gc_ms, 3),
                "cpu_ms": round(r.cpu_ms, 3)}
    read = [i for i, r in enumerate(results) if r.num_chunks]
    books = sorted(bookkeeping_ms(results[i]) for i in read)
    return {"num_reads": len(read), "num_chunks": sum(results[i].num_chunks for i in read),
            "read_ms": round(sum(results[i].ms for i in read), 1),
            "bookkeeping_ms": round(sum(books), 1),
            "bookkeeping_p50_ms": round(books[len(books) // 2], 3) if books else None,
            "bookkeeping_max_ms": round(books[-1], 3) if books else None,
            "longest": split(max(read, key=lambda i: results[i].ms)) if read else None,
            "longest_bookkeeping": split(max(read, key=lambda i: bookkeeping_ms(results[i])))
            if read else None}


def sync_copy_off(tensors, always_copy: bool = False, freed: bool = True):
    """The spill's copies off the device as they were made before copy_off: `.to("cpu")` in
    the reading thread, which waits for the work queued before it (the old arm; `freed`
    changes nothing here)."""
    return [t.to("cpu", copy=always_copy) for t in tensors], None


@contextlib.contextmanager
def copies_made(case: str):
    """For the case disk_sync_copies, block_store.spill's copies made by sync_copy_off."""
    if case != "disk_sync_copies":
        yield
        return
    saved = spill.copy_off
    spill.copy_off = sync_copy_off
    try:
        yield
    finally:
        spill.copy_off = saved


def run(args) -> dict:
    by_name = {s.name: s for s in agent_scripts.load(Path(args.agents))}
    scripts = [by_name[n] for n in args.names.split(",")]
    model = load_model(args.model, device=args.device)
    out = {"bench": "read_syncs", "model": args.model, "batch": args.batch,
           "agents": [s.name for s in scripts]}
    for name in args.cases.split(","):
        disk = name != "no_disk"
        pauses = GcPauses().install()      # as inside vLLM: timed, the warm-up's heap frozen
        with tempfile.TemporaryDirectory() as tmp, copies_made(name):
            reader = Reader(model, grid=args.grid, disk_dir=tmp if disk else None,
                            gc_ms=lambda: pauses.total_ms)
            reader.warm_up(batch_sessions=args.batch)
            pauses.freeze_heap()
            audit = args.sync_audit and args.device == "cuda"
            profile = LongestProfile() if args.profile else None
            results, syncs = follow(reader, scripts, args, audit, profile)
            counters = reader.stats()
            pauses.remove()
            gc.unfreeze()                  # the next case freezes its own
            out[name] = {**parts(results),
                         "gdn_entries_evicted": counters.get("gdn_entries_evicted"),
                         "evicted_written": counters.get("evicted_written"),
                         "gdn_entries_not_written": counters.get("gdn_entries_not_written"),
                         "write_errors": counters.get("write_errors"),
                         "syncs_by_site": dict(syncs.most_common(12)) if audit else None,
                         "num_syncs": sum(syncs.values()) if audit else None,
                         "profile": profile.top() if profile else None,
                         "num_gc_pauses": pauses.num_pauses, "gc_pauses_ms":
                         round(pauses.pauses_ms, 1), "gc_pause_max_ms": round(pauses.max_ms, 3)}
            reader.close()
        print(name, json.dumps(out[name])[:3000], flush=True)
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else "none"
    return {**out, "gpu": gpu, "dtype": str(model.dtype).removeprefix("torch."),
            "commit": git_commit(), "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__, "python": platform.python_version(),
            "date": str(datetime.date.today())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="random:tiny")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--grid", type=int, default=512)
    ap.add_argument("--agents", default=".devdata/agents.npz")
    ap.add_argument("--names", default="f67,aider,e80,swe",
                    help="the agents of the file followed (default: the live trial's four)")
    ap.add_argument("--batch", type=int, default=4, help="sessions' chunks a forward, at most")
    ap.add_argument("--output-ids", type=int, default=64, help="the host's output a turn")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", default="disk",
                    help=f"comma-separated, run in order: {', '.join(CASES)}")
    ap.add_argument("--sync-audit", action="store_true",
                    help="count the calls that wait for the device, by call site (CUDA)")
    ap.add_argument("--profile", action="store_true",
                    help="every read under cProfile: the longest bookkeeping's functions")
    args = ap.parse_args(argv)
    for name in args.cases.split(","):     # before the model loads
        if name not in CASES:
            ap.error(f"--cases: {name!r} is not one of {', '.join(CASES)}")
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
