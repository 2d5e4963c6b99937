"""The peer for the read benchmark: transformers' Qwen3_5ForCausalLM reading the same ids chunk
by chunk with its own cache on the same grid (with fla's kernels when fla is installed, as
transformers swaps them in by itself). Only used by evals.bench."""
from __future__ import annotations

import tempfile

import torch

from adapters.model.config import PRESETS
from adapters.model.export import save_hf_dir
from adapters.model.weights import random_tensors


def _hf_model(spec: str, device: torch.device):
    import transformers
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if spec.startswith("random:"):
        cfg = PRESETS[spec[len("random:"):]]
        tmp = tempfile.mkdtemp(prefix="shadow-peer-")
        path = save_hf_dir(cfg, random_tensors(cfg), tmp)
    else:
        path = spec
    model = transformers.Qwen3_5ForCausalLM.from_pretrained(path, dtype=dtype)
    return model.to(device).eval(), transformers


def transformers_read_ms_per_1k(spec: str, device: torch.device, ids: list[int], grid: int,
                                timer) -> float:
    """ms per 1,000 ids for transformers reading `ids` (whole chunks of `grid`) from 0."""
    model, transformers = _hf_model(spec, device)
    total_ms, n = 0.0, len(ids) // grid * grid
    with torch.no_grad():
        for warm in (True, False):
            cache = transformers.DynamicCache(config=model.config)
            for start in range(0, n if not warm else min(n, 2 * grid), grid):
                chunk = torch.tensor([ids[start:start + grid]], device=device)
                _, ms = timer(lambda: model(input_ids=chunk, past_key_values=cache,
                                            use_cache=True, logits_to_keep=1))
                if not warm:
                    total_ms += ms
    return round(total_ms / n * 1000, 2)
