"""The trial's cost phase (evals/vllm/trial.py): the host's decode tokens/s and TTFT on A and S,
arms alternating (a: no connector, b: the shadow idle, c: the shadow reading), and each arm's
KV-cache capacity. Each run's row also has the per-step slot's own time in it (slot_ms, from
the status's engine_share) and the gaps between the tokens as they arrived (gap_ms_median,
gap_ms_max, slow_gaps_ms): whether what the decode lost is the slot's time, or more (the
host's pipeline stalled), and whether as one stall or spread over the steps."""
from __future__ import annotations

import json
import statistics
import time

from evals.vllm import agents
from evals.vllm.client import G, load_servers, shadow_status, stream_timing, trial_dir, write_result
from evals.vllm.server import VllmServer, log_facts

ARMS = ("a", "b", "c")


def cost_prompt(ids: list[int], run: int, num_ids: int) -> list[int]:
    """A num_ids-id prompt of a new session for run `run`: a window of `ids` at its own
    offset, its first id made unique, so neither the host's prefix cache nor the shadow's
    pages hold any of it."""
    span = max(1, len(ids) - num_ids)
    start = (run * 7919) % span
    prompt = list(ids[start:start + num_ids])
    prompt[0] = 1000 + run
    return prompt


def wait_idle(server: VllmServer, timeout_s: float) -> dict:
    """Wait until no session of the shadow has a page of backlog; the last status."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = shadow_status(server)
        if all(s["backlog"] < G for s in status["sessions"].values()) or \
                time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def cost(args) -> None:
    servers = load_servers()
    host_a, host_s = servers["A"], servers["S"]
    long = next(s for s in agents.load(args.agents) if s.name == args.long)
    ids = list(long.first_prompt) + [t for x in long.suffixes for t in x]
    for name, server in (("A", host_a), ("S", host_s)):     # warm: each server's first run
        stream_timing(server, cost_prompt(ids, 10_000 + len(name), args.prompt_ids),
                      args.new_tokens, {"shadow_follow": False} if name == "S" else None)
    rows = []
    for run in range(args.runs):
        for arm in ARMS[run % len(ARMS):] + ARMS[:run % len(ARMS)]:     # each arm first in turn
            wait_idle(host_s, 60)
            time.sleep(args.gap_s)
            status = shadow_status(host_s)
            before, share_before = status["chunks_by_window"], status.get("engine_share", {})
            server = host_a if arm == "a" else host_s
            params = {"a": None, "b": {"shadow_follow": False},
                      "c": {"shadow_session": f"cost-{run}"}}[arm]
            prompt = cost_prompt(ids, run * len(ARMS) + ARMS.index(arm), args.prompt_ids)
            row = {"run": run, "arm": arm, **stream_timing(server, prompt,
                                                           args.new_tokens, params)}
            status = shadow_status(host_s)
            during, share = status["chunks_by_window"], status.get("engine_share", {})
            # the per-step slot's own time in this request (the in-turn ration's work) beside
            # what the decode lost: a cost past the slot's time is the host's pipeline stalled
            row["slot_ms"] = share.get("slot_ms", 0.0) - share_before.get("slot_ms", 0.0)
            for part in ("lock_wait_ms", "sync_wait_ms"):     # where the slot's time went
                row[f"slot_{part}"] = share.get(part, 0.0) - share_before.get(part, 0.0)
            # outside the slot, what the steps' starts waited for: the turn's prompt to be
            # applied, and the turnstile (event batches, questions, the idle chunk in flight)
            for part in ("start_wait_ms", "gate_wait_ms"):
                row[part] = share.get(part, 0.0) - share_before.get(part, 0.0)
            # what the scheduler expects a ration slice to cost beyond its chunks, after it
            row["slice_overhead_ms"] = share.get("slice_overhead_ms", 0.0)
            after = wait_idle(host_s, 60)["chunks_by_window"]     # and what the gap read
            row["shadow_chunks"] = {w: during.get(w, 0) - before.get(w, 0) for w in during}
            row["shadow_chunks_with_gap"] = {w: after.get(w, 0) - before.get(w, 0)
                                             for w in after}
            rows.append(row)
            print(f"run {run} arm {arm}: decode {row['decode_tok_s']:.2f} tok/s, TTFT "
                  f"{row['ttft_ms']:.1f} ms, shadow chunks {row['shadow_chunks']} (with the "
                  f"gap after it {row['shadow_chunks_with_gap']}), slot {row['slot_ms']:.1f} "
                  f"ms (lock {row['slot_lock_wait_ms']:.1f}, sync {row['slot_sync_wait_ms']:.1f}"
                  f"; a slice's overhead expected {row['slice_overhead_ms']:.1f}), the prompt's "
                  f"hand-off {row['start_wait_ms']:.1f} ms, the turnstile "
                  f"{row['gate_wait_ms']:.1f} ms, token gaps "
                  f"median {row['gap_ms_median']:.2f} ms, slow "
                  f"{[round(g, 1) for g in row['slow_gaps_ms']]}", flush=True)
            (trial_dir() / "cost.json").write_text(json.dumps(     # kept should the call end
                summarize_cost(rows, host_a, host_s), indent=1))
    write_result("cost", summarize_cost(rows, host_a, host_s))


def summarize_cost(rows: list[dict], host_a: VllmServer, host_s: VllmServer) -> dict:
    """Per arm: median and mean decode tok/s and TTFT, the chunks its turns' ration read and in
    how many runs (c's reading in the turn is what it measures: on an H100 a starved events
    thread once left it at 2 chunks in 6 runs), the paired deltas against arm a (each run's b
    or c against the same run's a), and each server's KV-cache capacity."""
    arms = {}
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine:
            continue
        arms[arm] = {"runs": len(mine),
                     # whether the arm did what it names: c's ration read in its turns
                     "ration_chunks": sum(r.get("shadow_chunks", {}).get("ration", 0)
                                          for r in mine),
                     "runs_with_ration": sum(1 for r in mine
                                             if r.get("shadow_chunks", {}).get("ration", 0)),
                     "decode_tok_s_median": statistics.median(r["decode_tok_s"] for r in mine),
                     "decode_tok_s_mean": statistics.fmean(r["decode_tok_s"] for r in mine),
                     "ttft_ms_median": statistics.median(r["ttft_ms"] for r in mine),
                     "ttft_ms_stdev": statistics.stdev(r["ttft_ms"] for r in mine)
                     if len(mine) > 1 else 0.0}
    by_run = {(r["run"], r["arm"]): r for r in rows}
    for arm in ("b", "c"):
        if arm not in arms or "a" not in arms:
            continue
        deltas = [by_run[(run, arm)]["decode_tok_s"] / by_run[(run, "a")]["decode_tok_s"] - 1
                  for run in sorted({r["run"] for r in rows})
                  if (run, arm) in by_run and (run, "a") in by_run]
        if not deltas:
            continue
        arms[arm]["decode_vs_a_pct_median"] = 100 * statistics.median(deltas)
        arms[arm]["decode_vs_a_pct_each"] = [round(100 * d, 2) for d in deltas]
        arms[arm]["ttft_vs_a_ms_median"] = arms[arm]["ttft_ms_median"] - arms["a"]["ttft_ms_median"]
    capacity = {name: log_facts(s.log.read_text(errors="replace"))
                for name, s in (("A", host_a), ("S", host_s))}
    return {"arms": arms, "rows": rows, "capacity": capacity}
