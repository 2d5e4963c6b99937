"""The cost of a move (issue 37): a session read on server A continues on server B over one
shared folder. Two `serve` subprocesses on one SHADOW_DISK with SHADOW_DISK_SHARED=1 (as
behind a router that sends a session's next turn elsewhere); B restores the session from the
folder (the manifest A wrote, then pages and GDN states by key) and reads what it lacks.

For each --sizes N: a prompt of N random ids and --output-ids outputs on A, read up; then a
next turn of --new-ids user ids and --output-ids outputs on B, read up. For each --sessions
FILE (a recorded agent session, rendered by the chat template as `shadow-reader replay`
renders it, without its questions): every turn but the last on A, each read up before the
next; the last on B; with --stay, a second pass on a fresh folder where the last turn stays on
A (what a move is compared with when the turn rewrites earlier ids).

Reported per move: on A, the ids it read and the time (a cold read: what B pays without the
folder); on B, `restore_ms` (status: the manifest read, pages and states loaded), the /turn
call's wall time (the restore inside it), the line B resumed at, the ids it read and of them
those read again below A's C (`reread_tokens`), its read time, the bytes of the pages it
loaded, and its exactness check; the ids staying on A would have read.

    python -m evals.move [--model random:tiny] [--device cpu] [--grid 512]
        [--sizes 8192,32768,65536] [--sessions FILE ...] [--stay] [--no-check]

The servers share this machine's page cache: B reads what A just wrote from memory, as on one
host or a file system with a warm client cache; a remote object store adds its latency
(docs/scale.md). The last line printed is one JSON object (the machine, versions, commit and
date); the table before it goes in BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import httpx
import torch

from evals.serve_proc import caught_up, free_port, start_service, status, stop_service, turn
from evals.stall import git_commit


def start_pair(args, folder: Path, names=("a", "b")) -> list[tuple]:
    """Servers on one shared disk folder (SHADOW_DISK_SHARED=1), each with its own state
    folder: [(process, url)], ready. Raises RuntimeError when one does not start in 300 s."""
    out = []
    for name in names:
        env = {**os.environ, "SHADOW_MODEL": args.model, "SHADOW_DEVICE": args.device,
               "SHADOW_GRID": str(args.grid), "SHADOW_DISK": str(folder / "disk"),
               "SHADOW_DISK_SHARED": "1", "SHADOW_DIR": str(folder / name),
               "SHADOW_THREADS": str(args.threads), "SHADOW_POLL_S": "0.05"}
        try:
            out.append(start_service(env, free_port(), timeout_s=300, poll_s=0.2))
        except TimeoutError:
            for proc, _ in out:
                stop_service(proc)
            raise RuntimeError(f"server {name} did not start") from None
    return out


def read_up(url: str, sid: str, prompt: list[int], output: list[int], args) -> dict:
    """One turn on `url`, read up to its last whole page: what it cost there (status deltas:
    ids read and read again, read ms, restores and their ms), the /turn call's wall time,
    the line it resumed at (C at the end less the ids read) and C at the end."""
    before = status(url)
    turn_s = turn(url, sid, prompt, output)
    after = caught_up(url, sid, len(prompt) + len(output), args.grid, args.timeout_s, 0.5)
    committed = after["sessions"][sid]["committed"]
    num_read = after["read_tokens"] - before["read_tokens"]
    return {"turn_s": round(turn_s, 4), "committed": committed,
            "resumed_at": committed - num_read, "num_read_tokens": num_read,
            "num_reread_tokens": sum(after["reread_tokens"].values()) -
            sum(before["reread_tokens"].values()),
            "read_ms": round(after["totals"]["read_ms"] - before["totals"]["read_ms"], 1),
            "num_restores": after["restores"] - before["restores"],
            "restore_ms": round(after["restore_ms"] - before["restore_ms"], 1),
            "page_bytes": after["page_bytes"], "hint": after["sessions"][sid]}


def _check(url: str, sid: str, args) -> bool | None:
    if args.no_check:
        return None
    r = httpx.get(f"{url}/v1/shadow/sessions/{sid}/check", timeout=args.timeout_s)
    return bool(r.json().get("exact"))


def _hint(s: dict) -> dict:
    return {k: s[k] for k in ("warm_tokens", "held_tokens", "num_pages_memory",
                              "num_pages_disk", "kv_bytes", "gdn_bytes")}


def moved(a_url: str, b_url: str, sid: str, turns: list[tuple[list[int], list[int]]],
          args) -> dict:
    """Every turn but the last on A (each read up), the last on B; the figures (module doc).
    Raises ValueError for fewer than two turns."""
    if len(turns) < 2:
        raise ValueError(f"{sid}: a move needs two turns or more, got {len(turns)}")
    on_a = [read_up(a_url, sid, p, o, args) for p, o in turns[:-1]]
    a_last = on_a[-1]
    prompt, output = turns[-1]
    b = read_up(b_url, sid, prompt, output, args)
    loaded = b["resumed_at"] // args.grid * b["page_bytes"]
    out = {"num_ids": len(prompt) + len(output), "num_turns": len(turns),
           "a": {"num_read_tokens": sum(t["num_read_tokens"] for t in on_a),
                 "read_ms": round(sum(t["read_ms"] for t in on_a), 1),
                 "committed": a_last["committed"], "hint": _hint(a_last["hint"])},
           "b": {k: b[k] for k in ("turn_s", "restore_ms", "num_restores", "resumed_at",
                                   "num_read_tokens", "num_reread_tokens", "read_ms",
                                   "committed")},
           "below_a": max(0, a_last["committed"] - b["resumed_at"]),
           "loaded_bytes": loaded,
           "restore_mb_s": round(loaded / 2**20 / (b["restore_ms"] / 1000), 1)
           if b["restore_ms"] > 0 else None}
    out["b"]["exact"] = _check(b_url, sid, args)
    return out


def stayed(a_url: str, sid: str, turns, args) -> dict:
    """Every turn on A (the control of a move): the last turn's ids read and read again."""
    for p, o in turns[:-1]:
        read_up(a_url, sid, p, o, args)
    last = read_up(a_url, sid, *turns[-1], args)
    return {k: last[k] for k in ("resumed_at", "num_read_tokens", "num_reread_tokens",
                                 "read_ms", "committed")}


def synthetic(n: int, args) -> list[tuple[list[int], list[int]]]:
    """Two turns: n random ids and their outputs; then the next user message and outputs."""
    rng = random.Random(n)

    def ids(k: int) -> list[int]:
        return [rng.randrange(1000, 240000) for _ in range(k)]

    first, out1 = ids(n), ids(args.output_ids)
    second = first + out1 + ids(args.new_ids)
    return [(first, out1), (second, ids(args.output_ids))]


def recorded(path: str) -> list[tuple[list[int], list[int]]]:
    """A session file's host turns (prompt ids, output ids), rendered as replay renders them."""
    from evals.replay import load_session
    from shadow_plugin.chat.host_view import host_turns
    from shadow_plugin.chat.renderer import Renderer
    from shadow_plugin.chat.tokenizer import load_tokenizer
    messages, tools = load_session(path)
    turns = host_turns(messages, tools or None, Renderer.from_model_dir(None), load_tokenizer())
    return [(list(t.prompt_ids), list(t.output_ids)) for t in turns]


def table(res: dict) -> str:
    """The moves as a Markdown table."""
    rows = ["| session | ids | A read (ids, s) | B: restore ms (MB/s) | B: /turn s | "
            "B resumed at | read on B (again) | staying reads | exact |",
            "| --- | ---: | --- | --- | ---: | ---: | --- | ---: | --- |"]
    for m in res["moves"]:
        a, b = m["a"], m["b"]
        rows.append(
            f"| {m['name']} | {m['num_ids']:,} | {a['num_read_tokens']:,}, "
            f"{a['read_ms'] / 1000:.1f} | {b['restore_ms']:.0f} ({m['restore_mb_s']}) | "
            f"{b['turn_s']:.2f} | {b['resumed_at']:,} | {b['num_read_tokens']:,} "
            f"({b['num_reread_tokens']:,}) | {_n(m['stay_reads'])} | {b['exact']} |")
    return "\n".join(rows)


def _n(x) -> str:
    return "-" if x is None else f"{x:,}"


def run(args) -> dict:
    """The whole measurement (module doc); the servers are stopped at the end."""
    work = [(f"random {n:,}", f"move-{n}", synthetic(n, args)) for n in args.sizes]
    work += [(Path(p).stem, Path(p).stem[:100], recorded(p)) for p in args.sessions]
    moves, load_before = [], os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="shadow-move-") as tmp:
        servers = start_pair(args, Path(tmp) / "moves")
        try:
            (_, a_url), (_, b_url) = servers
            for name, sid, turns in work:
                m = moved(a_url, b_url, sid, turns, args)
                p, o = turns[-1]
                m["name"] = name            # random ids: no rewrite, the new pages only
                m["stay_reads"] = (len(p) + len(o)) // args.grid * args.grid - \
                    m["a"]["committed"] if sid.startswith("move-") else None
                print(f"{name}: {json.dumps(m)}", file=sys.stderr, flush=True)
                moves.append(m)
            server = status(a_url)["server"]
        finally:
            for proc, _ in servers:
                stop_service(proc)
        if args.stay and args.sessions:
            for m, (name, sid, turns) in zip(moves[len(args.sizes):], work[len(args.sizes):]):
                (proc, a_url), = start_pair(args, Path(tmp) / f"stay-{sid}", names=("a",))
                try:
                    m["stay"] = stayed(a_url, sid, turns, args)
                    m["stay_reads"] = m["stay"]["num_read_tokens"]
                finally:
                    stop_service(proc)
                print(f"{name} stayed: {json.dumps(m['stay'])}", file=sys.stderr, flush=True)
    try:
        own = metadata.version("shadow-reader")
    except metadata.PackageNotFoundError:
        own = "not installed"
    return {"model": args.model, "device": args.device, "grid": args.grid,
            "threads_per_server": args.threads, "identity": server["identity"],
            "moves": moves, "commit": git_commit(),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "torch": torch.__version__, "python": platform.python_version(),
            "shadow_reader": own, "loadavg_1m": [load_before[0], os.getloadavg()[0]],
            "date": str(datetime.date.today()),
            "time": time.strftime("%H:%M:%S")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:tiny")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--grid", type=int, default=512)
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",") if x],
                    default=[8192, 32768, 65536], help="ids of the random sessions moved")
    ap.add_argument("--sessions", nargs="*", default=[], help="recorded session files")
    ap.add_argument("--stay", action="store_true", help="also the recorded sessions' last "
                    "turn on A, on a fresh folder (the control)")
    ap.add_argument("--new-ids", type=int, default=256, help="ids of the next user message")
    ap.add_argument("--output-ids", type=int, default=256, help="outputs of each turn")
    ap.add_argument("--threads", type=int, default=1, help="torch threads a server")
    ap.add_argument("--timeout-s", type=float, default=1800.0, help="the longest read-up")
    ap.add_argument("--no-check", action="store_true", help="skip B's exactness check")
    args = ap.parse_args(argv)
    res = run(args)
    print(table(res), file=sys.stderr)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
