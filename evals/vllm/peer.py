"""The trial's peer phase (evals/vllm/trial.py): a long session turn by turn on S and on P (vLLM
serving the shadow's model with prefix caching), the router question at 32k and 100k ids from
both, the answers' KL, the peer's prefix-cache hits."""
from __future__ import annotations

import json
import math
import statistics
import time

from evals.vllm import agents
from evals.vllm.client import (
    HTTP_S,
    check,
    complete,
    load_servers,
    shadow_status,
    trial_dir,
    wait_fresh,
    write_result,
)
from evals.vllm.server import VllmServer


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
        r = host.http.post(host.url + "/v1/shadow/ask", json=body, timeout=HTTP_S)
        if r.status_code != 200:
            raise RuntimeError(f"ask: {r.status_code} {r.text[:300]}")
        timing = dict(p.strip().split(";dur=") for p in
                      r.headers.get("server-timing", "").split(",") if ";dur=" in p)
        shadow.append({**r.json(), "http_ms": (time.perf_counter() - t0) * 1e3,
                       "server_ms": float(timing.get("server", "nan"))})
    cached = [peer_question(peer, prompt, letters) for _ in range(repeats)]
    fresh = [peer_question(peer, prompt, letters, salt=f"fresh-{len(ids)}-{i}-{time.time()}")
             for i in range(repeats)]
    p_shadow = shadow[-1]["probs"]
    out = {"num_ids": len(ids), "question_ids": len(prompt) - len(ids),
           "shadow_ask_ms": [round(s["ms"], 2) for s in shadow],
           "shadow_http_ms": [round(s["http_ms"], 2) for s in shadow],
           # what the door, vLLM's utility calls and HTTP added to the worker's own time
           "shadow_overhead_ms": [round(s["http_ms"] - s["ms"], 2) for s in shadow],
           # of it, the server's own (its route's Server-Timing less the forward): the rest
           # is HTTP's and the client's
           "shadow_server_overhead_ms": [round(s["server_ms"] - s["ms"], 2) for s in shadow],
           # each ask's ids forwarded: fewer once the idle window kept the session's tail
           "shadow_forwarded": [s["num_forwarded_tokens"] for s in shadow],
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
    text = peer.http.get(peer.url + "/metrics", timeout=60).text
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
    script = next(s for s in agents.load(args.agents) if s.name == args.long)
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
        prompt = agents.next_prompt(prompt, out, script.suffixes[k])
    result.update(peer_summary(turns))
    result["check"] = check(host, name, ids)
    status = shadow_status(host)
    result["shadow_read_path"] = status.get("read_path")
    # the runners' graphs (the tails' states-keeping ones captured at first use) and the tails
    result["shadow_graphs"] = status.get("graphs")
    result["shadow_tails"] = {k: status.get(k) for k in
                              ("tails_held", "tail_hits", "tails_made", "tails_evicted",
                               "tails_replaced", "tail_bytes")}
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
