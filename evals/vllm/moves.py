"""The trial's moves phase (evals/vllm/trial.py; issue 38): S served with
`--data-parallel-size N` (one shadow in each DP engine, one shared SHADOW_DISK folder), agents
whose turns land on other ranks, every session exact after it moved.

Two parts:
- pinned: one agent's turns sent to the ranks `ranks` names in turn (vLLM's
  X-data-parallel-rank header, which its balancer honours), each turn waited for: the rank
  that served it holds the session with exactly the ids vLLM served and produced, exact
  through the check route; the other ranks read nothing; a move reads again at most one page
  (`max_reread_tokens`: the rank it left had read all and written its pages and state to the
  folder before the move, so the folder lacked nothing).
- balanced: the other agents concurrently, no header (vLLM's balancer picks the rank of each
  turn: the engine with the fewest waiting and running requests), then every session exact
  once read; `copies_given_up` (the ranks' `superseded`: a rank gives its copy up when the
  session comes back to it, a lower bound on the moves), and the ids read beyond what the
  sessions committed (`reread_tokens`: the
  moves' re-reads, pages the folder lacked at a move included, and the re-rendered
  histories').

    python -m evals.vllm.trial moves --agents .devdata/agents.npz --pinned f67 \\
        --names aider e80 swe
`pinned_turns` is what tests/integration/test_vllm.py runs on vLLM's CPU engine.
"""
from __future__ import annotations

import dataclasses
import time

import httpx

from evals.vllm import agents
from evals.vllm.client import check, complete, load_servers, shadow_status, write_result
from evals.vllm.follow import run_agents
from evals.vllm.server import VllmServer


def held_on(server: VllmServer, session: str, rank: int | None, num_ids: int, grid: int,
            timeout_s: float, poll_s: float = 0.1) -> dict:
    """The merged status once rank `rank` (None: whichever holds its newest state) holds
    `session` with num_ids ids, every whole page of them (grid ids) committed. A status that
    cannot be read or lacks the sessions (a rank not ready: the merged status leaves them
    out) is asked again. Raises TimeoutError with the session's entry after timeout_s
    seconds."""
    deadline, entry = time.monotonic() + timeout_s, None
    while True:
        try:
            status = shadow_status(server)
            entry = status["sessions"].get(session)
        except (httpx.HTTPError, ValueError, KeyError):       # a busy server: asked again
            status = entry = None
        if entry is not None and rank in (None, entry.get("rank")) and \
                entry["num_ids"] == num_ids and entry["committed"] >= num_ids // grid * grid:
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"{session}: not read on rank {rank} in {timeout_s} s: {entry}")
        time.sleep(poll_s)


def pinned_turns(server: VllmServer, script: agents.AgentScript, ranks: list[int],
                 num_tokens: int, grid: int, timeout_s: float) -> list[dict]:
    """script's first len(ranks) turns (at most its turns; each prompt the last one and its
    output and the recording's next suffix, agents.next_prompt: its re-rendered history is
    not sent, so that a turn's re-read is a move's alone), turn k sent to rank ranks[k] and
    waited for (held_on), then checked. One row a turn: rank, num_ids, committed before and
    after, read_tokens per rank in the turn, moved (another rank than the last turn's),
    reread_tokens (the serving rank's read beyond the session's growth: what a move read
    again), check (client.check: `ok` when exact with exactly these ids), and the ranks'
    superseded counts after it. Raises TimeoutError when a turn is not read in time."""
    prompt, rows, committed, last = list(script.first_prompt), [], 0, None
    for k, rank in enumerate(ranks[:script.num_turns]):
        before = [r["read_tokens"] for r in shadow_status(server)["ranks"]]
        out, _ = complete(server, prompt, num_tokens, {"shadow_session": script.name},
                          headers={"X-data-parallel-rank": str(rank)})
        ids = prompt + out
        status = held_on(server, script.name, rank, len(ids), grid, timeout_s)
        read = [r["read_tokens"] - b for r, b in zip(status["ranks"], before)]
        now = status["sessions"][script.name]["committed"]
        rows.append({"turn": k, "rank": rank, "num_ids": len(ids), "committed_before": committed,
                     "committed": now, "read_tokens": read, "moved": last not in (None, rank),
                     "reread_tokens": read[rank] - (now - committed),
                     "superseded": [r["superseded"] for r in status["ranks"]],
                     "check": check(server, script.name, ids)})
        print(f"pinned {rows[-1]}", flush=True)
        committed, last = now, rank
        if k + 1 < script.num_turns:
            prompt = agents.next_prompt(prompt, out, script.suffixes[k])
    return rows


def summarize_pinned(rows: list[dict], grid: int) -> dict:
    """The pinned part's figures: turns, moves, every check ok, the largest re-read of a move
    and whether it is within one page, and whether the ranks that did not serve a turn read
    nothing in it."""
    moves = [r for r in rows if r["moved"]]
    reread = max((r["reread_tokens"] for r in moves), default=0)
    return {"turns": len(rows), "moves": len(moves),
            "all_exact": all(r["check"]["ok"] for r in rows),
            "max_reread_tokens": reread, "reread_within_a_page": reread <= grid,
            "others_read_nothing": all(n == 0 for r in rows
                                       for rank, n in enumerate(r["read_tokens"])
                                       if rank != r["rank"])}


def balanced(server: VllmServer, scripts: list, num_tokens: int, grid: int,
             timeout_s: float) -> dict:
    """The agents concurrently with no header, then each session waited for (fully read
    on the rank holding it) and checked: per agent its ids, rank, the ranks that know it and
    its check; copies_given_up (the ranks' superseded counts gained: a rank gives its copy up
    when the session comes back to it after a move, so this is at most the number of moves:
    one that does not come back is not counted), reread_tokens (ids read beyond the
    sessions' committed growth), all_exact. Raises RuntimeError naming the agents that
    failed."""
    status = shadow_status(server)
    superseded = sum(r["superseded"] for r in status["ranks"])
    read = status["read_tokens"]
    committed = sum(status["sessions"].get(s.name, {}).get("committed", 0) for s in scripts)
    held, agents_s = run_agents(server, scripts, num_tokens)
    out: dict = {"agents": {}, "agents_s": round(agents_s, 1)}
    for s in scripts:
        status = held_on(server, s.name, None, len(held[s.name]), grid, timeout_s)
        entry = status["sessions"][s.name]
        out["agents"][s.name] = {"num_ids": len(held[s.name]), "rank": entry["rank"],
                                 "ranks": entry.get("ranks"),
                                 "check": check(server, s.name, held[s.name])}
    status = shadow_status(server)
    grown = sum(status["sessions"][s.name]["committed"] for s in scripts) - committed
    out.update({"copies_given_up": sum(r["superseded"] for r in status["ranks"]) - superseded,
                "read_tokens": status["read_tokens"] - read, "committed_growth": grown,
                "reread_tokens": status["read_tokens"] - read - grown,
                "all_exact": all(a["check"]["ok"] for a in out["agents"].values()),
                "write_errors": sum(r["write_errors"] for r in status["ranks"])})
    return out


def moves(args) -> None:
    server = load_servers()["S"]
    status = shadow_status(server)
    if status.get("num_ranks", 1) < 2:
        raise RuntimeError("S serves one rank: start it with --vllm-args "
                           "'--data-parallel-size 2' for the moves phase")
    grid = status["ranks"][0]["grid"]
    tag = int(time.time()) % 100_000            # names of their own on a server used before
    scripts = {s.name: dataclasses.replace(s, name=f"{s.name}-{tag}")
               for s in agents.load(args.agents)}
    missing = [n for n in [args.pinned, *args.names] if n not in scripts]
    if missing:
        raise ValueError(f"{args.agents} holds no agent {missing}; it holds {sorted(scripts)}")
    ranks = [k % status["num_ranks"] for k in range(args.pinned_turns)]
    rows = pinned_turns(server, scripts[args.pinned], ranks, args.tokens, grid,
                        args.fresh_timeout_s)
    result = {"num_ranks": status["num_ranks"], "grid": grid,
              "pinned": {"agent": args.pinned, **summarize_pinned(rows, grid), "rows": rows}}
    write_result("moves", result)            # kept should the balanced part not finish
    result["balanced"] = balanced(server, [scripts[n] for n in args.names], args.tokens, grid,
                                  args.fresh_timeout_s)
    write_result("moves", result)
