"""The trial's follow phase (evals/vllm/trial.py): agents replayed concurrently on S, every
session checked against exactly the ids vLLM served and produced, ask and the OpenAI-shaped
answer, then SIGTERM, a restart and a turn that reads nothing again."""
from __future__ import annotations

import dataclasses
import threading
import time

from evals.vllm import agents
from evals.vllm.client import (
    HTTP_S,
    check,
    complete,
    launch_recorded,
    load_servers,
    shadow_status,
    trial_dir,
    wait_fresh,
    write_result,
)
from evals.vllm.server import VllmServer, log_facts


def run_agent(server: VllmServer, script, num_tokens: int, held: dict, errors: list,
              max_turns: int | None = None) -> None:
    """Replay `script` on the host: each turn's prompt (agents.next_prompt, or the
    re-rendered history at its turn), the host's output; held[name] = the last prompt and
    output, held[name + ':next'] the prompt the next turn would send (None after the last),
    held[name + ':turn'] that turn's index."""
    try:
        prompt = list(script.first_prompt)
        turns = script.num_turns if max_turns is None else min(max_turns, script.num_turns)
        for k in range(turns):
            out, _ = complete(server, prompt, num_tokens, {"shadow_session": script.name})
            held[script.name] = prompt + out
            if k + 1 >= script.num_turns:
                held[script.name + ":next"] = None
                break
            if k + 1 == script.rerender_turn:
                prompt = list(script.rerender_prompt)
            else:
                prompt = agents.next_prompt(prompt, out, script.suffixes[k])
            held[script.name + ":next"], held[script.name + ":turn"] = prompt, k + 1
    except Exception as e:                        # reported by the phase, not lost in a thread
        errors.append(f"{script.name}: {e!r}")


def run_agents(server: VllmServer, scripts, num_tokens: int,
               limits: list | None = None) -> tuple[dict, float]:
    """The scripts replayed concurrently (run_agent, a thread each; limits: each one's turns
    at most, None for all): (held, as run_agent fills it, and the seconds they took). Raises
    RuntimeError naming the agents that failed."""
    held: dict = {}
    errors: list[str] = []
    t0 = time.monotonic()
    threads = [threading.Thread(target=run_agent,
                                args=(server, s, num_tokens, held, errors, n))
               for s, n in zip(scripts, limits or [None] * len(scripts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"agents failed: {errors}")
    return held, time.monotonic() - t0


def follow(args) -> None:
    servers = load_servers()
    server = servers["S"]
    tag = int(time.time()) % 100_000            # names of their own on a server used before
    scripts = [dataclasses.replace(s, name=f"{s.name}-{tag}")
               for s in agents.load(args.agents) if s.name in args.names]
    # the first agent keeps its last turns for after the restart (restart: nothing read again)
    limits = [max(1, s.num_turns - args.hold_turns) if i == 0 and not args.no_restart
              else None for i, s in enumerate(scripts)]
    if args.max_turns is not None:
        limits = [min(args.max_turns, n or args.max_turns) for n in limits]
    graphs_before = shadow_status(server).get("graphs") or {}
    held, agents_s = run_agents(server, scripts, args.tokens, limits)
    names = [s.name for s in scripts]
    status = wait_fresh(server, {n: held[n] for n in names}, args.fresh_timeout_s)
    # CUDA graphs captured while the agents ran and were read up (at first use: each syncs
    # the device, a read or a question holding the lock through it); {} without graphs
    graphs_after = status.get("graphs") or {}
    graphs = {k: round(graphs_after[k] - graphs_before.get(k, 0), 3)
              for k in ("num_captures", "num_failed_captures", "capture_s")
              if k in graphs_after}
    checks = [check(server, n, held[n]) for n in names]
    for c in checks:
        print(f"check {c}", flush=True)
    print(wait_line(status, graphs), flush=True)
    # the questions through vLLM's server: ask, and the same in the OpenAI shape
    from shadow_plugin.chat.router import ROUTER
    q = {"session": names[0], "question": ROUTER.question, "choices": list(ROUTER.choices)}
    ask = server.http.post(server.url + "/v1/shadow/ask", json=q, timeout=HTTP_S).json()
    chat = server.http.post(server.url + "/v1/shadow/chat/completions", timeout=HTTP_S, json={
        "session": names[0], "choices": list(ROUTER.choices),
        "messages": [{"role": "user", "content": ROUTER.question}]}).json()
    chat_label = chat["choices"][0]["message"]["content"]
    log = log_facts(server.log.read_text(errors="replace"))
    totals, windows = status["totals"], status["chunks_by_window"]
    before = {n: status["sessions"][n]["committed"] for n in names}
    result = {"agents": {s.name: {"turns": n or s.num_turns, "num_ids": len(held[s.name]),
                                  "rerender_turn": s.rerender_turn}
                         for s, n in zip(scripts, limits)},
              "agents_s": round(agents_s, 1), "checks": checks,
              "all_exact": all(c["ok"] for c in checks),
              "ask": ask, "chat_label": chat_label,
              "ask_matches_chat": chat_label == ask.get("label"),
              "chunks_by_window": windows,
              "both_windows": windows.get("ration", 0) > 0 and windows.get("idle", 0) > 0,
              "read_tokens": totals["num_read_tokens"], "totals": totals,
              # the host's longest stall on the shadow (a step's start at the turnstile: the
              # idle window's forward in flight, one batch with SHADOW_BATCH_SESSIONS > 1)
              # and the slot's longest slice, beside the batched forwards read
              "engine_share": status.get("engine_share"),
              "batched": {k: totals.get(k, 0) for k in ("num_batched_forwards",
                                                        "num_batched_chunks")},
              "graphs_captured_meanwhile": graphs,
              "committed": sum(before.values()),
              "host_status": status.get("host"), "host_log": log}
    write_result("follow", result)           # kept should the restart not finish
    if args.no_restart:
        return
    result["restart"] = restart(args, server, scripts, held, before, totals["num_read_tokens"])
    write_result("follow", result)


def wait_line(status: dict, graphs: dict) -> str:
    """The host's longest wait on the shadow at a step's start, what it may have waited for
    (the longest hold, the longest read and its parts) and the batched forwards, from a
    status (/v1/shadow/status; "n/a" for what a server does not report)."""
    share, totals = status.get("engine_share") or {}, status.get("totals") or {}

    def ms(d: dict, key: str) -> str:
        return f"{d[key]:.2f} ms" if isinstance(d.get(key), (int, float)) else "n/a"
    behind = share.get("gate_wait_max_behind_hold")
    rest = "n/a" if behind is None else "a hold" if behind else "the idle loop's read"
    return (f"the host's longest wait: {ms(share, 'gate_wait_max_ms')} at a step's start "
            f"(rank 0's; {ms(share, 'gate_wait_max_let_in_ms')} of it until the holds asked "
            f"before it got in, the rest behind {rest}; garbage collections during it "
            f"{ms(share, 'gate_wait_max_gc_ms')}); the longest hold through the "
            f"turnstile {ms(share, 'gate_hold_max_ms')} "
            f"({share.get('gate_hold_max_kind') or 'n/a'}, its CPU time "
            f"{ms(share, 'gate_hold_max_cpu_ms')}, garbage collections during it "
            f"{ms(share, 'gate_hold_max_gc_ms')}); the longest read "
            f"{ms(totals, 'read_max_ms')} ({totals.get('read_max_num_chunks', 'n/a')} chunks, "
            f"after {totals.get('read_max_num_chunks_before', 'n/a')} read before it; "
            f"{ms(totals, 'read_max_host_part_ms')} of it before its final wait for the device, "
            f"{ms(totals, 'read_max_forward_ms')} in the adapter's forward calls, its "
            f"thread's CPU time {ms(totals, 'read_max_cpu_ms')}, garbage "
            f"collections during it {ms(totals, 'read_max_gc_ms')}; of all reads' "
            f"{ms(totals, 'read_ms')}, "
            f"{ms(totals, 'read_sync_ms')} their final waits for the device; a read's host "
            f"part at most {ms(totals, 'read_host_max_ms')}, its final wait for the device "
            f"at most {ms(totals, 'read_sync_max_ms')}); the slot's longest slice "
            f"{ms(share, 'slot_max_ms')}; batched forwards "
            f"{totals.get('num_batched_forwards', 'n/a')} of "
            f"{totals.get('num_batched_chunks', 'n/a')} chunks; CUDA graphs captured "
            f"meanwhile {graphs or 'n/a'}; garbage collections since the shadow was up: "
            f"{share.get('num_gc_pauses', 'n/a')} in {ms(share, 'gc_pauses_ms')}, the longest "
            f"{ms(share, 'gc_pause_max_ms')} (generation "
            f"{share.get('gc_pause_max_generation', 'n/a')}, set off by thread "
            f"{share.get('gc_pause_max_thread') or 'n/a'}); in its start "
            f"{share.get('num_gc_startup_pauses', 'n/a')} in "
            f"{ms(share, 'gc_startup_pauses_ms')}, the longest "
            f"{ms(share, 'gc_startup_pause_max_ms')}; the shadow's startup heap frozen: "
            f"{share.get('gc_frozen_objects', 'n/a')} objects; the CUDA allocator since: "
            f"{share.get('cuda_num_device_alloc', 'n/a')} cudaMalloc, "
            f"{share.get('cuda_num_device_free', 'n/a')} cudaFree, "
            f"{share.get('cuda_num_alloc_retries', 'n/a')} retries after freeing its cache, "
            f"{share.get('cuda_num_sync_all_streams', 'n/a')} syncs of all streams")


def restart(args, server: VllmServer, scripts, held: dict, before: dict,
            read_before: int) -> dict:
    """SIGTERM (the shadow writes its sessions), a restart on the same SHADOW_DISK, then the
    next turn of the first agent that has one: nothing is read again."""
    code = server.stop()
    disk = trial_dir() / "disk"
    manifests = sorted((disk / "sessions").rglob("*.safetensors"))
    on_disk = {kind: len(list((disk / kind).glob("*.safetensors"))) for kind in ("pages", "gdn")}
    t0 = time.monotonic()
    log = trial_dir() / "logs" / "S-restart.log"
    new = launch_recorded("S", server.spec, log)      # recorded before the wait
    new.wait_ready(args.start_timeout_s)
    start_s = time.monotonic() - t0
    status = shadow_status(new)
    resumed = {n: status["sessions"].get(n, {}).get("committed") for n in before}
    script = next((s for s in scripts if held.get(s.name + ":next")), None)
    out = {"exit_code": code, "num_manifests": len(manifests), "files_on_disk": on_disk,
           "stop_log": [line.split(") ", 1)[-1] for line in
                        server.log.read_text(errors="replace").splitlines()
                        if "shadow-reader: stopped" in line or "shadow: stopped" in line
                        or "not written at the stop" in line],
           "start_s": round(start_s, 1),
           "committed_before": before, "committed_after": resumed,
           "same_committed": resumed == before,
           "read_tokens_at_start": status["totals"]["num_read_tokens"],
           "read_tokens_before_stop": read_before}
    if script is not None:
        out.update(continue_agent(args, new, script, held, before[script.name]))
    print(f"restart {out}", flush=True)
    return out


def continue_agent(args, server: VllmServer, script, held: dict, committed: int,
                   max_turns: int = 6) -> dict:
    """The agent's next turns on the restarted server until the shadow commits past
    `committed` (a page read after the restart): the ids read since the start equal the
    growth of C when nothing was read again."""
    from_turn = held[script.name + ":turn"]
    prompt, grew, status, turns = held[script.name + ":next"], 0, {}, 0
    for k in range(from_turn, min(script.num_turns, from_turn + max_turns)):
        out_ids, _ = complete(server, prompt, args.tokens, {"shadow_session": script.name})
        held[script.name], turns = prompt + out_ids, turns + 1
        status = wait_fresh(server, {script.name: held[script.name]}, args.fresh_timeout_s)
        grew = status["sessions"][script.name]["committed"] - committed
        if grew > 0 or k + 1 >= script.num_turns:
            break
        prompt = agents.next_prompt(prompt, out_ids, script.suffixes[k])
    return {"continued": script.name, "turns_after_restart": turns,
            "restores": status.get("restores"),
            "read_tokens_after": status["totals"]["num_read_tokens"], "committed_growth": grew,
            "nothing_read_again": grew > 0 and status["totals"]["num_read_tokens"] == grew,
            "check": check(server, script.name, held[script.name])}
