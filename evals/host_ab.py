"""What the shadow costs a host on the same GPU (issue 6): a host model of the Qwen3.5-27B shape
(random weights) serves one request after another (a 16k-id prompt, a new session each time,
--new-tokens greedy tokens, --gap-s between requests); the shadow (random:qwen3.5-0.8b) follows
it through the in-process Host interface in alternating arms (off, on, off, on, ...). Prints the
host's decode tok/s and TTFT per run and arm, the paired deltas, and last one JSON object.

    python -m evals.host_ab --pairs 6 --ids .devdata/claudecode_vsla_5f8cbb78.npz
    python -m evals.host_ab --pairs 6 --warm-turns 4 ...   # the scheduler has seen 4 gaps:
        # the ration leaves to the idle window what they cover (SHADOW_IDLE_TRUST, default 0.5)
    SHADOW_IDLE_TRUST=0 SHADOW_IDLE_AT_FINISH=0 python -m evals.host_ab ...   # the seed's rules

The host decodes through this project's own runners (runners.runners.Runners: the prompt in
512-id chunk graphs, each token in a single-token graph), so its loop is a real CUDA-graph
decode loop; the shadow reads in its ration between the host's tokens (Host.between_rounds on
the host's thread) and in the idle window between requests (the idle loop thread).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import numpy as np
import torch

from adapters import spec_for
from adapters.model import load_model
from adapters.model.config import PRESETS, ModelConfig
from adapters.model.kernels import select_kernels
from adapters.model.qwen35 import ModelInfo, Qwen35
from adapters.runners.runners import Runners
from block_store.memory.layout import alloc_kv, zero_gdn
from evals.bench import versions
from shadow_plugin.reader.reader import Reader
from shadow_plugin.scheduling.host import Host
from shadow_plugin.scheduling.scheduler import SchedulerConfig

HOST_27B = ModelConfig(hidden_size=5120, num_hidden_layers=64, num_attention_heads=24,
                       num_key_value_heads=4, head_dim=256, intermediate_size=17408,
                       linear_num_key_heads=16, linear_num_value_heads=48,
                       tie_word_embeddings=False)


def host_model(device, shape: str = "27b") -> Qwen35:
    """The 27B-shape host (or a preset's shape), built on the device in bf16 with the modules'
    own random init (a seeded generator; 27B weights built on the host would take minutes)."""
    cfg = HOST_27B if shape == "27b" else PRESETS[shape]
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen35(cfg, select_kernels(torch.device(device)),
                           ModelInfo(f"random:{shape}-shape-host", "", True))
    finally:
        torch.set_default_dtype(prev)
    return model.eval()


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


class Engine:
    """The host: prefill through chunk graphs, greedy decode through the single-token graph."""

    def __init__(self, model: Qwen35, max_rows: int):
        self.model, self.max_rows = model, max_rows
        self.runners = Runners(model, 512)
        self.busy = False

    def request(self, ids: list[int], new_tokens: int, on_tokens=None) -> dict:
        m, dev = self.model, self.model.device
        spec = spec_for(m.cfg, dev, m.dtype)
        kv, gdn = alloc_kv(spec, self.max_rows), zero_gdn(spec)
        self.busy = True
        _sync(dev)
        t0 = time.perf_counter()
        for pos in range(0, len(ids), 512):
            hidden, gdn = self.runners.run(torch.tensor(ids[pos:pos + 512]), pos, kv, gdn)
        token = int(m.logits(hidden[-1:])[0].argmax())
        ttft = time.perf_counter() - t0
        step, pos, out = self.runners.decode().run, len(ids), [token]
        if on_tokens:
            on_tokens([token])
        t1 = time.perf_counter()
        while len(out) < new_tokens:
            hidden, gdn = step(torch.tensor([token]), pos, kv, gdn)
            token = int(m.logits(hidden)[0].argmax())
            out.append(token)
            pos += 1
            if on_tokens:
                on_tokens([token])       # output() and between_rounds(): every token a round
        _sync(dev)
        decode_s = time.perf_counter() - t1
        self.busy = False
        return {"ttft_s": ttft, "tok_s": (len(out) - 1) / decode_s, "decode_s": decode_s}


def follow(host: Host, session: str, spent: list):
    """The host's per-round calls for the shadow: the new ids, then a ration slice (its ms
    added to spent[0]); the wall ms of both calls on the host's thread added to spent[1]."""
    def on_tokens(new: list[int]) -> None:
        t0 = time.perf_counter()
        host.output(session, new)
        spent[0] += host.between_rounds(session).ms
        spent[1] += (time.perf_counter() - t0) * 1e3
    return on_tokens


def warm_turns(engine: Engine, host: Host, ids: list[int], a, tag: str) -> None:
    """a.warm_turns requests with the shadow on before the A/B (not measured), a.gap_s apart:
    the scheduler sees the host's gaps as a shadow that has run beside the host a while has
    (SchedulerConfig.idle_trust trusts them after 4)."""
    for i in range(a.warm_turns):
        session, prompt = f"{tag}-warm{i}", ids[i * 11:i * 11 + a.prompt]
        host.turn_started(session, prompt)
        engine.request(prompt, a.new_tokens, follow(host, session, [0.0, 0.0]))
        host.turn_finished(session)
        time.sleep(a.gap_s)


def run_arms(engine: Engine, host: Host, shadow: Reader, ids: list[int], a, tag: str) -> dict:
    """2 x pairs requests, arms alternating off/on; per-arm medians and paired deltas."""
    warm_turns(engine, host, ids, a, tag)
    runs = []
    for i in range(2 * a.pairs):
        arm = "on" if i % 2 else "off"
        prompt = ids[i * 7:i * 7 + a.prompt]                 # another prompt each run
        session, spent, on_tokens = f"{tag}-run{i}", [0.0, 0.0], None
        if arm == "on":
            host.turn_started(session, prompt)
            on_tokens = follow(host, session, spent)
        r = engine.request(prompt, a.new_tokens, on_tokens)
        if arm == "on":
            host.turn_finished(session)
            r.update(committed_at_end=shadow.committed(session), ration_ms=spent[0],
                     ration_pct=100 * spent[0] / (r["decode_s"] * 1e3),
                     host_calls_pct=100 * spent[1] / (r["decode_s"] * 1e3))
        r["arm"] = arm
        runs.append(r)
        print(f"{tag} run {i:2d} {arm:>3}: {r['tok_s']:.2f} tok/s, TTFT {r['ttft_s'] * 1e3:.0f} "
              f"ms, ration {r.get('ration_ms', 0):.0f} ms, shadow calls "
              f"{r.get('host_calls_pct', 0):.2f} % of decode, C {r.get('committed_at_end')}",
              flush=True)
        time.sleep(a.gap_s)
        if arm == "on":                  # what the idle window read in the gap (under the lock)
            with host.lock:
                r["committed_after_gap"] = shadow.committed(session)
                r["held"] = len(shadow.ids(session))
    off = [r["tok_s"] for r in runs if r["arm"] == "off"]
    on = [r["tok_s"] for r in runs if r["arm"] == "on"]
    return {"share": host.config.share, "idle_trust": host.config.idle_trust,
            "idle_at_finish": host.config.idle_at_finish, "warm_turns": a.warm_turns,
            "tok_s_off_median": statistics.median(off),
            "tok_s_on_median": statistics.median(on),
            "delta_pct_median": 100 * (statistics.median(on) / statistics.median(off) - 1),
            "paired_deltas_pct": [round(100 * (b - x) / x, 2) for x, b in zip(off, on)],
            "ration_pct_median": statistics.median(r["ration_pct"] for r in runs
                                                   if r["arm"] == "on"),
            "host_calls_pct_median": statistics.median(r["host_calls_pct"] for r in runs
                                                       if r["arm"] == "on"),
            "ttft_s_off_median": statistics.median(r["ttft_s"] for r in runs if r["arm"] == "off"),
            "ttft_s_on_median": statistics.median(r["ttft_s"] for r in runs if r["arm"] == "on"),
            "runs": runs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ids", nargs="+", required=True, help=".npz files of evals/session_ids.py")
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--prompt", type=int, default=16384)
    p.add_argument("--new-tokens", type=int, default=346)
    p.add_argument("--gap-s", type=float, default=1.5)
    p.add_argument("--warm-turns", type=int, default=0,
                   help="requests with the shadow on before the A/B, not measured (the "
                        "scheduler learns the host's gaps)")
    p.add_argument("--shares", default="",
                   help="comma-separated ration shares, one A/B each (default: SHADOW_SHARE or 0.02)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--host", default="27b", help="27b, or a preset name (a CPU smoke test)")
    p.add_argument("--shadow-model", default="random:qwen3.5-0.8b")
    a = p.parse_args()
    ids = np.concatenate([np.load(f)["ids"] for f in a.ids]).tolist()
    engine = Engine(host_model(a.device, a.host), a.prompt + a.new_tokens + 512)
    shadow = Reader(load_model(a.shadow_model, device=a.device), grid=512)
    base = SchedulerConfig.from_env(grid=512)
    warm = ids[:a.prompt]
    engine.request(warm, 8)                                  # graphs, compiles
    shadow.feed("warm", warm, "prompt")
    shadow.read("warm")
    shadow.drop("warm")
    res = {"host": f"{a.host} shape, random bf16", "shadow": a.shadow_model,
           "prompt_ids": a.prompt, "new_tokens": a.new_tokens, "gap_s": a.gap_s, "ab": []}
    for share in [float(x) for x in a.shares.split(",") if x] or [base.share]:
        host = Host(shadow, host_busy=lambda: engine.busy,
                    cfg=dataclasses.replace(base, share=share))
        host.start_idle_loop()
        res["ab"].append(run_arms(engine, host, shadow, ids, a, f"share{share}"))
        host.stop_idle_loop()
    print(json.dumps({**res, **versions()}))


if __name__ == "__main__":
    main()
