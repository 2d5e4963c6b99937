"""Write stored tensors as a Hugging Face directory (config.json + safetensors shards).

Used by the tests (transformers loads what we wrote) and by users who want the random presets as a
checkpoint. Names: `model.*` (Qwen3_5ForCausalLM) or `model.language_model.*`
(Qwen3_5ForConditionalGeneration). The layout Qwen released its checkpoints in ("released":
Qwen3_5ForConditionalGeneration, the text model's config nested under `text_config`) is the
one every vLLM from 0.26 on loads as a host (with `--language-model-only`: no vision weights);
vLLM 0.26 registers no text-only Qwen3_5ForCausalLM.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from adapters.model.config import ModelConfig

PREFIXES = {"causal": "model.", "conditional": "model.language_model."}
# export_preset's layouts: (tensor name scheme, config nested under text_config)
LAYOUTS = {"released": ("conditional", True), "causal": ("causal", False),
           "conditional": ("conditional", False)}


def save_hf_dir(cfg: ModelConfig, tensors: dict[str, torch.Tensor], path, scheme="causal",
                num_shards: int = 1, text_config: bool = False) -> Path:
    """Write `tensors` (stripped names, as `weights.random_tensors` returns) to `path`.

    Args: scheme "causal" or "conditional" (name prefix); num_shards >= 1 (an index json is written
    when > 1); text_config: nest the config under `text_config` as released checkpoints do.
    Returns the directory. Raises ValueError for an unknown scheme.
    """
    if scheme not in PREFIXES:
        raise ValueError(f"unknown scheme {scheme!r}; expected one of {sorted(PREFIXES)}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    hf = cfg.to_hf()
    if text_config:
        hf = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
              "text_config": {**hf, "model_type": "qwen3_5_text"},
              "tie_word_embeddings": cfg.tie_word_embeddings}
    (path / "config.json").write_text(json.dumps(hf, indent=2))
    # copies: fused projections (model.fuse) leave parameters sharing one storage, which
    # safetensors refuses to write
    named = {(n if n == "lm_head.weight" else PREFIXES[scheme] + n): t.detach().clone()
             for n, t in tensors.items()}
    names = sorted(named)
    shards = [names[i::num_shards] for i in range(num_shards)]
    if num_shards == 1:
        save_file(named, str(path / "model.safetensors"), metadata={"format": "pt"})
        _mode_of_config(path, "model.safetensors")
        return path
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors"
        save_file({n: named[n] for n in shard}, str(path / fname), metadata={"format": "pt"})
        _mode_of_config(path, fname)
        weight_map.update({n: fname for n in shard})
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))
    return path


def export_preset(spec: str, path, layout: str = "released") -> Path:
    """Write the seeded random weights of `spec` (random:NAME, NAME a config.PRESETS key) as a
    Hugging Face directory at `path` (what a vLLM host or transformers loads; the same weights
    and fingerprint as load_model(spec)) in `layout` (a LAYOUTS key). Raises ValueError for
    another spec, an unknown preset or an unknown layout."""
    from adapters.model.config import PRESETS
    from adapters.model.weights import random_tensors
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    scheme, nested = LAYOUTS[layout]
    name = spec.removeprefix("random:")
    if not spec.startswith("random:") or name not in PRESETS:
        raise ValueError(f"{spec!r}: export-model takes random:NAME with NAME one of "
                         f"{', '.join(PRESETS)}")
    return save_hf_dir(PRESETS[name], random_tensors(PRESETS[name]), path, scheme,
                       text_config=nested)


def _mode_of_config(path: Path, fname: str) -> None:
    """Give a weight file config.json's permissions: safetensors writes its files 0600, so a
    server running as another user could read the config but not the weights."""
    os.chmod(path / fname, (path / "config.json").stat().st_mode & 0o777)
