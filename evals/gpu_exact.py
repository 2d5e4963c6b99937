"""GPU exactness check (issue 2): replay a real session's ids turn by turn through the CUDA path,
with rewrites and random read budgets, then compare the committed state with a fresh prefill bit
for bit; compare the CUDA path (bf16, fla) with the CPU path (fp32, torch) by the relative RMS
error of the logits.

    python -m evals.session_ids ../shared/data/sessions/claudecode_vsla_5f8cbb78.json -o .devdata
    python -m evals.gpu_exact --ids .devdata/claudecode_vsla_5f8cbb78.npz

Prints a table of turns and, last, one JSON object (GPU, dtype, versions, date, results).
"""
from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np
import torch

from adapters import spec_for
from adapters.model.config import PRESETS
from adapters.model.qwen35 import ModelInfo
from adapters.model.weights import build_model, fingerprint, random_tensors
from block_store import contiguous_kv
from block_store.memory.layout import zero_gdn
from evals.bench import versions
from shadow_plugin.reader.reader import Reader

CHOICES = ["chat", "code_edit", "debug", "design_ui", "explain", "plan", "refactor", "review",
           "test"]
QUESTION = "Which kind of request is the user's latest turn?"


def turns(ids: np.ndarray, starts: np.ndarray, roles: np.ndarray):
    """(prompt_end, output_end) per assistant message: the prompt is everything before it."""
    ends = list(starts[1:]) + [len(ids)]
    return [(int(s), int(e)) for s, e, r in zip(starts, ends, roles) if r == "assistant"]


def replay(reader: Reader, ids: list[int], plan, rng: random.Random, rewrite_every: int):
    """Feed every turn (prompt, random read budget, output); every `rewrite_every` turns the
    prompt differs from what was read a few hundred ids back (as dropped reasoning does)."""
    held: list[int] = []
    stats = {"turns": 0, "rollbacks": 0, "num_reread": 0, "read_ms": 0.0, "asks": 0}
    for t, (p_end, o_end) in enumerate(plan):
        prompt = held + ids[len(held):p_end] if len(held) <= p_end else ids[:p_end]
        if t and t % rewrite_every == 0 and reader.committed("s") > 600:
            cut = reader.committed("s") - rng.randrange(1, 600)
            prompt = prompt[:cut] + [(prompt[cut] + 1) % 248000] + prompt[cut + 1:]
        res = reader.feed("s", prompt, "prompt")
        if res.rolled_back_to is not None:
            stats["rollbacks"] += 1
            stats["num_reread"] += res.rolled_back_from - res.rolled_back_to
        budget = None if rng.random() < 0.5 else rng.randrange(0, 40)
        stats["read_ms"] += reader.read("s", max_chunks=budget).ms
        reader.feed("s", ids[p_end:o_end], "output")
        held = reader.ids("s")
        stats["turns"] += 1
        if t % 10 == 0:
            a1 = reader.ask("s", QUESTION, CHOICES)
            a2 = reader.ask("s", QUESTION, CHOICES)
            assert a1.probs == a2.probs, "the same question twice gave other probabilities"
            stats["asks"] += 1
            print(f"turn {t:4d}  ids {len(held):6d}  C {reader.committed('s'):6d}  "
                  f"ckpts {reader.checkpoint_positions('s')}  ask {a1.label} "
                  f"{max(a1.probs):.3f} {a1.ms:.1f} ms", flush=True)
    stats["read_ms"] += reader.read("s").ms
    return stats


def last_hidden(model, ids: list[int], grid: int) -> torch.Tensor:
    """Hidden states [T, hidden] (before the final norm) of the last chunk of a plain chunked
    prefill of `ids`, on the model's device."""
    cfg, dev = model.cfg, model.device
    kv = contiguous_kv(spec_for(cfg, dev, model.dtype), grid, len(ids))
    gdn = zero_gdn(spec_for(cfg, dev, model.dtype))
    for s in range(0, len(ids), grid):
        h, gdn = model(torch.tensor(ids[s:s + grid], device=dev), s, kv, gdn)
    return h


def logits_of(model, ids: list[int], grid: int) -> torch.Tensor:
    """Logits [T, vocab] (fp32, CPU) of the last chunk of a plain chunked prefill."""
    return model.logits(last_hidden(model, ids, grid)).float().cpu()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ids", required=True, help="NAME.npz from evals/session_ids.py")
    ap.add_argument("--preset", default="qwen3.5-0.8b")
    ap.add_argument("--grid", type=int, default=512)
    ap.add_argument("--rewrite-every", type=int, default=7)
    ap.add_argument("--cpu-ids", type=int, default=1024, help="ids for the CUDA-vs-CPU check")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    data = np.load(args.ids)
    ids, plan = data["ids"].tolist(), turns(data["ids"], data["starts"], data["roles"])
    cfg = PRESETS[args.preset]
    t0 = time.perf_counter()
    tensors = random_tensors(cfg)
    info = ModelInfo(f"random:{args.preset}", fingerprint(tensors), True)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = build_model(cfg, tensors, info, args.device, dtype)
    result = {"preset": args.preset, "fingerprint": info.fingerprint, "grid": args.grid,
              "dtype": str(dtype).removeprefix("torch."), "kernels": model.kernels.name,
              "num_ids": len(ids), "load_s": round(time.perf_counter() - t0, 1), **versions()}
    reader = Reader(model, grid=args.grid)
    result["path"] = reader.path                 # the attention and runners the bits come from
    rng = random.Random(0)
    stats = replay(reader, ids, plan, rng, args.rewrite_every)
    result.update(stats)
    result["committed"] = reader.committed("s")
    # the chunk runner's captures with FA4 in its graph (one per number of splits and pool,
    # made at the first such chunk; their seconds are inside read_ms)
    split_graphs = getattr(getattr(getattr(reader.adapter, "runners", None), "chunk", None),
                           "split_graphs", None)
    if split_graphs is not None:
        result["num_captures"] = split_graphs.num_captures
        result["capture_s"] = round(split_graphs.capture_s, 3)
    t1 = time.perf_counter()
    result["exact"] = reader.check_exact("s")
    result["check_exact_s"] = round(time.perf_counter() - t1, 2)
    at = reader.committed("s") - 300          # an ask below C forks from a checkpoint
    below = reader.ask("s", QUESTION, CHOICES, at=at)
    fresh = Reader(model, grid=args.grid)
    fresh.feed("f", reader.ids("s")[:at], "prompt")
    result["ask_below_c_equals_fresh"] = \
        fresh.ask("f", QUESTION, CHOICES, at=at).probs == below.probs
    del reader, fresh
    if args.device == "cuda":
        torch.cuda.empty_cache()
    cpu = build_model(cfg, tensors, info, "cpu", torch.float32)
    want = logits_of(cpu, ids[:args.cpu_ids], args.grid)
    got = logits_of(model, ids[:args.cpu_ids], args.grid)
    rel = ((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()).item()
    result["cuda_vs_cpu_logits_rel_rms"] = rel
    result["cuda_vs_cpu_top1_agree"] = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    result["read_ms_per_1k"] = round(stats["read_ms"] / (result["committed"] + stats["num_reread"])
                                     * 1000, 2)
    line = json.dumps(result)
    if args.out:
        with open(args.out, "w") as f:
            f.write(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
