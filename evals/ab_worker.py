"""The worker of evals/pages_ab.py: one reader in one tree of the code, driven by commands on
stdin (one JSON object a line), answering one JSON object a line on stdout. Run as a script by
its path (`python evals/ab_worker.py --model M --device D --grid G [--small-bucket-rows
64,128|none]`, the tree's code first on PYTHONPATH), so the tree measured need not have this
file; evals/kernel_profile.py is loaded from beside it for the same reason.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

QUESTION = ("Which kind of turn is this?", ["chat", "code_edit", "debug", "design_ui", "explain",
                                            "plan", "refactor", "review", "test"])


def _timer(device: str):
    import time

    import torch
    if device == "cuda":
        def run(fn):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            return a.elapsed_time(b)
        return run

    def wall(fn):
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return wall


def _sync(device: str) -> None:
    """Wait for the GPU's queued work (so a host clock read after it counts that work)."""
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


def _reserved(device: str) -> int:
    """Bytes torch's CUDA allocator holds (its pools, the CUDA graphs' included); 0 on the
    CPU."""
    import torch
    return torch.cuda.memory_reserved() if device == "cuda" else 0


def _kernel_profile():
    """evals/kernel_profile.py of this file's tree (the worker's `evals` package is its own
    tree's, which may not have it)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "kernel_profile", Path(__file__).resolve().with_name("kernel_profile.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _host_calls(fn, n: int) -> dict:
    """Host time of n calls of fn (a read of one chunk, a question): to the first CUDA graph
    replay (the GPU idles until then: it counts in the call's time), and in all; then a
    cProfile of n more calls, the 20 functions of largest cumulative time (ms a call)."""
    import cProfile
    import pstats
    import time

    import torch
    first, lead, total = [], [], []
    replay = torch.cuda.CUDAGraph.replay

    def noted(graph):
        first.append(time.perf_counter())
        return replay(graph)
    torch.cuda.CUDAGraph.replay = noted
    try:
        for _ in range(n):
            first.clear()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            total.append((time.perf_counter() - t0) * 1e3)
            lead.append((first[0] - t0) * 1e3 if first else -1.0)
            torch.cuda.synchronize()
    finally:
        torch.cuda.CUDAGraph.replay = replay
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats
    rows = sorted(((v[3] * 1e3 / n, f"{k[0].split('/')[-2:]}:{k[2]}") for k, v in stats.items()),
                  reverse=True)[:20]
    return {"lead_ms": statistics.median(lead), "host_ms": statistics.median(total),
            "cumulative_ms": [(round(ms, 3), name) for ms, name in rows]}


class BandRefused(ValueError):
    """A band this worker will not time (the reason in its message)."""


def _band_session(reader, ids: list[int], start: int, end: int, grid: int, k: int) -> str:
    """A session of its own holding ids [0, end) read (untimed) to `start`: its name. Its first
    id is the timed session's plus 11 + k (k: this call's number), so it shares no page with
    that session nor with an earlier band's: a paged tree would otherwise resume from the pages
    and states an earlier call left cached, and time nothing (as it did on 2026-12-02).
    Raises BandRefused for a band that is not whole chunks within the ids, or when the read
    did not stop at `start`; on any error the session is dropped."""
    if start % grid or end % grid or not 0 <= start < end <= len(ids):
        raise BandRefused(f"band [{start}, {end}) must be whole chunks within the {len(ids)} "
                          "ids (raise --max-context)")
    name = f"band_{k}"
    reader.feed(name, [(ids[0] + 11 + k) % 240000] + ids[1:end], "prompt")
    try:
        if start:
            reader.read(name, max_chunks=start // grid)
        if reader.committed(name) != start:
            raise BandRefused(f"band [{start}, {end}) started at {reader.committed(name)} (a "
                              "resume from cached pages?)")
    except BaseException:
        reader.drop(name)
        raise
    return name


def _band(reader, ids: list[int], start: int, end: int, timed, grid: int, k: int) -> dict:
    """The read rate over ids [start, end) read as a backlog (one read call, the host ahead of
    the GPU) in a session of its own (_band_session), then dropped: {"ms", "ms_per_1k"}, or
    {"error"} for a band refused or not read in full."""
    try:
        name = _band_session(reader, ids, start, end, grid, k)
    except BandRefused as e:
        return {"error": str(e)}
    try:
        ms = timed(lambda: reader.read(name, max_chunks=(end - start) // grid))
        done = reader.committed(name)
    finally:
        reader.drop(name)
    if done != end:
        return {"error": f"band [{start}, {end}) read to {done}"}
    return {"ms": ms, "ms_per_1k": ms * 1000 / (end - start)}


def _profile_band(reader, ids: list[int], start: int, end: int, n: int, grid: int,
                  k: int) -> dict:
    """Kernel by kernel (evals/kernel_profile.py), the band [start, end)'s chunks n to 2n - 1
    (ids [start + n G, start + 2n G), G the grid) read back to back as one read call in a
    session of its own, after its chunks 0 to n - 1 read untraced (kernel_table's first
    call): the backlog's idle gaps. {"error"} when the band holds fewer than 2n chunks or is
    refused."""
    if start + 2 * n * grid > end:
        return {"error": f"band [{start}, {end}) holds fewer than the {2 * n} chunks "
                         "profile_band reads"}
    try:
        name = _band_session(reader, ids, start, start + 2 * n * grid, grid, k)
    except BandRefused as e:
        return {"error": str(e)}
    try:
        return _kernel_profile().kernel_table(lambda: reader.read(name, max_chunks=n), calls=1)
    finally:
        reader.drop(name)


def _reader(model, grid: int, small_bucket_rows: tuple[int, ...] | None):
    """The tree's Reader with its default forwards; with small_bucket_rows (() for none),
    through the runners with those small question buckets (adapters.model.runners.Runners, in
    a tree that has them)."""
    from shadow_plugin import Reader
    if small_bucket_rows is None:
        return Reader(model, grid=grid)
    from adapters import GraphAdapter
    from adapters.model.runners import Runners
    runners = Runners(model, grid, small_bucket_rows=small_bucket_rows)
    return Reader(GraphAdapter(model, grid, runners=runners))


def worker(model_name: str, device: str, grid: int,
           small_bucket_rows: tuple[int, ...] | None = None) -> None:
    """Commands on stdin, one JSON object a line; one JSON answer a line on stdout."""
    import time

    from shadow_plugin import load_model
    t0 = time.perf_counter()
    model = load_model(model_name, device=device)
    t1 = time.perf_counter()
    reader = _reader(model, grid, small_bucket_rows)      # on CUDA: the chunk runner's warm-up
    _sync(device)
    setup = {"load_s": t1 - t0, "build_s": time.perf_counter() - t1}
    timed, ids, out, num_bands = _timer(device), [], sys.stdout, 0
    sys.stdout = sys.stderr                      # library prints stay off the answer channel
    for line in sys.stdin:
        cmd = json.loads(line)
        op, ans = cmd["op"], {}
        if op == "ids":
            ids = cmd["ids"]
            t0 = time.perf_counter()
            reader.warm_up()                     # the other runners' captures
            t1 = time.perf_counter()
            # other keys: nothing shared; 9 chunks (past 4,096 ids: every number of FA4 splits
            # of a 512-id chunk on an H200) also for trees that capture at the first chunk
            warm = [(ids[0] + 7) % 240000] + ids[1:9 * grid]
            reader.feed("warm", warm, "prompt")
            reader.read("warm")
            reader.drop("warm")
            reader.feed("s", ids, "prompt")
            _sync(device)
            setup.update(warm_up_s=t1 - t0, warm_read_s=time.perf_counter() - t1)
            # seconds: model load, reader construction, warm_up, the 9 warm chunks (a tree that
            # captures at its first chunks spends it there); bytes after all of them
            ans = {k: round(v, 3) for k, v in setup.items()}
            ans["cuda_reserved_bytes"] = _reserved(device)
        elif op == "read_to":
            while reader.committed("s") < cmd["at"]:
                reader.read("s", max_chunks=1)
        elif op in ("chunk", "chunks") and len(ids) - reader.committed("s") < \
                cmd.get("n", 1) * grid:
            ans = {"error": f"{len(ids) - reader.committed('s')} ids left to read: fewer than "
                            f"{cmd.get('n', 1)} chunks (raise --max-context)"}
        elif op == "chunk":
            ans = {"at": reader.committed("s"),
                   "ms": timed(lambda: reader.read("s", max_chunks=1))}
        elif op == "chunks":             # n chunks back to back, each timed: the host stays warm
            ans = {"ms": [timed(lambda: reader.read("s", max_chunks=1)) for _ in range(cmd["n"])]}
        elif op == "band":
            ans = _band(reader, ids, cmd["start"], cmd["end"], timed, grid, num_bands)
            num_bands += 1
        elif op == "profile_band":
            ans = _profile_band(reader, ids, cmd["start"], cmd["end"], cmd["n"], grid,
                                num_bands)
            num_bands += 1
        elif op == "ask":
            ans = {"ms": timed(lambda: reader.ask("s", QUESTION[0], QUESTION[1], at=cmd["at"]))}
        elif op == "decode":
            gen = reader.generate("s", [11, 12, 13], max_new_tokens=cmd["n"], stop_ids=())
            ans = {"ms_per_token": gen.ms_per_token}
        elif op in ("profile_chunk", "host_chunk") and \
                len(ids) - reader.committed("s") < (2 * cmd["n"] + 1) * grid:
            ans = {"error": f"{len(ids) - reader.committed('s')} ids left to read: fewer than "
                            f"{op} needs (raise --max-context)"}
        elif op == "profile_chunk":
            kernel_table = _kernel_profile().kernel_table
            ans = kernel_table(lambda: reader.read("s", max_chunks=1), calls=cmd["n"])
        elif op == "profile_decode":
            kernel_table = _kernel_profile().kernel_table
            ans = kernel_table(lambda: reader.generate("s", [11, 12, 13], max_new_tokens=cmd["n"],
                                                       stop_ids=()), calls=1)
        elif op == "host_chunk":
            ans = _host_calls(lambda: reader.read("s", max_chunks=1), cmd["n"])
        elif op == "profile_ask":
            kernel_table = _kernel_profile().kernel_table
            ans = kernel_table(lambda: reader.ask("s", QUESTION[0], QUESTION[1], at=cmd["at"]),
                               calls=cmd["n"])
        elif op == "host_ask":
            ans = _host_calls(lambda: reader.ask("s", QUESTION[0], QUESTION[1], at=cmd["at"]),
                              cmd["n"])
        elif op == "exact":
            runners = getattr(reader.adapter, "runners", None)     # a tree may have none
            ans = {"exact": bool(reader.check_exact("s")), "path": reader.path,
                   "small_bucket_rows": list(getattr(runners, "small_bucket_rows", ()))}
        print(json.dumps(ans), file=out, flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--grid", type=int, required=True)
    ap.add_argument("--small-bucket-rows", default=None,
                    type=lambda s: () if s == "none" else tuple(int(x) for x in s.split(",")),
                    help="small question buckets in rows, e.g. 64,128, or none (Runners; "
                         "default: the tree's own)")
    a = ap.parse_args()
    worker(a.model, a.device, a.grid, a.small_bucket_rows)
