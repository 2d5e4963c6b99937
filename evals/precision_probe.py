"""Where does the CUDA path's distance from the fp32 CPU path come from? Logits of the last
chunk of a plain chunked prefill for each (device, dtype, kernels) against CPU fp32 torch, as the
relative RMS error; plus the same for the hidden state after each layer of bf16 fla vs fp32."""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from adapters.model.config import PRESETS
from adapters.model.qwen35 import ModelInfo
from adapters.model.weights import build_model, random_tensors
from evals.gpu_exact import last_hidden


def run(model, ids, grid):
    """(logits, hidden) of the last chunk, as floats on the CPU."""
    h = last_hidden(model, ids, grid)
    return model.logits(h).float().cpu(), h.float().cpu()


def rel(a, b):
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ids", required=True)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--preset", default="qwen3.5-0.8b")
    args = ap.parse_args()
    ids = np.load(args.ids)["ids"][:args.n].tolist()
    cfg = PRESETS[args.preset]
    tensors = random_tensors(cfg)
    info = ModelInfo("probe", "", True)
    want, want_h = run(build_model(cfg, tensors, info, "cpu", torch.float32), ids, 512)
    out = {"logits_rms": want.pow(2).mean().sqrt().item(), "logits_std": want.std().item(),
           "hidden_rms": want_h.pow(2).mean().sqrt().item()}
    for dtype in (torch.float32, torch.bfloat16):
        for kern in ("torch", "fla"):
            m = build_model(cfg, tensors, info, "cuda", dtype, kern)
            got, got_h = run(m, ids, 512)
            key = f"cuda_{str(dtype)[6:]}_{kern}"
            out[key] = {"logits_rel_rms": rel(got, want), "hidden_rel_rms": rel(got_h, want_h),
                        "top1": (got.argmax(-1) == want.argmax(-1)).float().mean().item()}
            del m
            torch.cuda.empty_cache()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
