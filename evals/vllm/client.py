"""The vLLM trial's state (its servers, its results) and its calls to the servers: completions,
streamed timings, the shadow's status, the wait for a session to be read, the check route."""
from __future__ import annotations

import json
import os
import shlex
import statistics
import time
from pathlib import Path

from evals.vllm.server import ServerSpec, VllmServer

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
    tmp = path.with_suffix(".json.tmp")   # replaced whole: a call cut off mid-write keeps the old
    tmp.write_text(json.dumps(raw, indent=1))
    os.replace(tmp, path)


def launch_recorded(name: str, spec: ServerSpec, log: Path) -> VllmServer:
    """Launch server `name` detached and record it in the state at once, before any wait: a
    call that ends while it starts (the device tool's limit) leaves it findable, so the next
    call's `up` waits for it instead of starting a second one beside it (two hosts on one GPU
    run out of memory: the H100 on 2026-12-07, a restart cut off by the call's limit)."""
    server = VllmServer.launch(spec, log, detached=True)
    save_server(name, server)
    return server


def write_result(phase: str, result: dict) -> None:
    (trial_dir() / f"{phase}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({phase: result}), flush=True)


def server_spec(name: str, args) -> ServerSpec:
    """S, A or P (module doc) with the trial's flags."""
    shadow_env = {"SHADOW_MODEL": args.shadow_model, "SHADOW_DISK": str(trial_dir() / "disk"),
                  "SHADOW_DIR": str(trial_dir() / "state"), "SHADOW_GB": str(args.shadow_gb),
                  "SHADOW_IDLE_TRUST": str(args.idle_trust), "SHADOW_SHARE": str(args.share),
                  "SHADOW_BATCH_SESSIONS": str(getattr(args, "batch_sessions", 1))}
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


def complete(server: VllmServer, prompt: list[int], max_tokens: int,
             params: dict | None = None, headers: dict | None = None,
             **extra) -> tuple[list[int], dict]:
    """A /v1/completions request with a token-id prompt, greedy, exactly max_tokens ids
    (ignore_eos); (its output ids, its whole reply). params: kv_transfer_params; headers:
    the request's (X-data-parallel-rank pins a data-parallel engine)."""
    body = {"model": server.spec.name, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True, **extra}
    if params is not None:
        body["kv_transfer_params"] = params
    r = server.http.post(server.url + "/v1/completions", json=body, timeout=HTTP_S,
                         headers=headers)
    if r.status_code != 200:
        raise RuntimeError(f"{server.url} /v1/completions: {r.status_code} {r.text[:500]}")
    reply = r.json()
    return list(reply["choices"][0]["token_ids"]), reply


def stream_timing(server: VllmServer, prompt: list[int], max_tokens: int,
                  params: dict | None) -> dict:
    """A streamed greedy request of exactly max_tokens ids: ttft_ms (the request's start to
    its first token), decode_tok_s ((tokens - 1) / (last token - first token)), tokens, and
    the gaps between tokens as they arrived: gap_ms_median, gap_ms_max and slow_gaps_ms
    (those past twice the median, largest first, at most 8: a stall of the host's decode
    shows there as one gap, a steady cost as a higher median)."""
    url = server.url
    body = {"model": server.spec.name, "prompt": prompt, "max_tokens": max_tokens,
            "min_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "return_token_ids": True}
    if params is not None:
        body["kv_transfer_params"] = params
    times, num_tokens = [], 0
    t0 = time.perf_counter()
    with server.http.stream("POST", url + "/v1/completions", json=body,
                            timeout=HTTP_S) as r:
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
    arrivals = sorted(set(times))                  # one arrival per streamed chunk
    gaps_ms = [(b - a) * 1e3 for a, b in zip(arrivals, arrivals[1:])] or [0.0]
    median_ms = statistics.median(gaps_ms)
    return {"ttft_ms": (times[0] - t0) * 1e3, "tokens": num_tokens,
            "decode_tok_s": (num_tokens - 1) / (times[-1] - times[0]),
            "gap_ms_median": median_ms, "gap_ms_max": max(gaps_ms),
            "slow_gaps_ms": sorted((g for g in gaps_ms if g > 2 * median_ms),
                                   reverse=True)[:8]}


def shadow_status(server: VllmServer) -> dict:
    return server.http.get(server.url + "/v1/shadow/status", timeout=HTTP_S).json()


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
    exact and holding exactly `ids`; `rank` the data-parallel rank that answered (None with
    one engine)."""
    from shadow_plugin.server.facade import ids_digest
    r = server.http.get(f"{server.url}/v1/shadow/sessions/{session}/check",
                        timeout=HTTP_S).json()
    ok = r.get("exact") is True and r.get("num_ids") == len(ids) and \
        r.get("ids_xxh3") == ids_digest(ids)
    return {"session": session, "ok": ok, "exact": r.get("exact"), "num_ids": r.get("num_ids"),
            "committed": r.get("committed"), "rank": r.get("rank"),
            "error": r.get("error") or r.get("detail")}
