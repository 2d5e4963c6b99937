"""Weights: load a Hugging Face Qwen3.5 directory or build seeded random weights; fingerprint them.

`load_model(spec)` takes a directory (config.json + safetensors, Qwen3_5ForConditionalGeneration or
Qwen3_5ForCausalLM names; vision and MTP tensors skipped) or `random:NAME` with NAME in
config.PRESETS. Random weights come from numpy's default_rng (stable across machines and torch
versions), are rounded to the checkpoints' stored dtypes (bf16; A_log and the GDN norm fp32,
docs/specs/qwen35.md section 2.1), and so have the same fingerprint everywhere.
"""
from __future__ import annotations

import json
import logging
import sys
import zlib
from pathlib import Path

import numpy as np
import torch
import xxhash
from safetensors import safe_open

from adapters.model.config import PRESETS, ModelConfig
from adapters.model.kernels import select_kernels
from adapters.model.qwen35 import ModelInfo, Qwen35

log = logging.getLogger(__name__)
RANDOM_SEED = 20261129
FP32_SUFFIXES = ("linear_attn.A_log", "linear_attn.norm.weight")
SKIP_PREFIXES = ("model.visual.", "visual.", "mtp.", "model.mtp.")


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor of the text model (HF names without the model prefix)."""
    with torch.device("meta"):
        model = Qwen35(cfg)
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def stored_dtype(name: str) -> torch.dtype:
    """The dtype a released checkpoint stores this tensor in (section 2.1)."""
    return torch.float32 if name.endswith(FP32_SUFFIXES) else torch.bfloat16


def fingerprint(tensors: dict[str, torch.Tensor]) -> str:
    """xxh3-128 hex over the sorted names, shapes, dtypes and raw bytes of CPU tensors."""
    h = xxhash.xxh3_128()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(f"{name}|{list(t.shape)}|{t.dtype}|".encode())
        h.update(t.view(torch.uint8).numpy().data if t.numel() else b"")
    return h.hexdigest()


def _random_tensor(name: str, shape: tuple[int, ...], cfg: ModelConfig, seed: int) -> torch.Tensor:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    n = int(np.prod(shape))
    if name.endswith("A_log"):
        a = np.log(rng.uniform(1.0, 16.0, n)).astype(np.float32)
    elif name.endswith("dt_bias"):
        a = (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32))
    elif name.endswith("linear_attn.norm.weight"):
        a = 1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)
    elif name.endswith("norm.weight"):            # zero-centred norms: (1 + w)
        a = 0.1 * rng.standard_normal(n, dtype=np.float32)
    elif name.endswith("conv1d.weight"):
        a = rng.uniform(-0.5, 0.5, n).astype(np.float32)
    else:                                         # embedding and projections: std 0.02 as HF init
        a = 0.02 * rng.standard_normal(n, dtype=np.float32)
    return torch.from_numpy(a.astype(np.float32).reshape(shape)).to(stored_dtype(name))


def random_tensors(cfg: ModelConfig, seed: int = RANDOM_SEED) -> dict[str, torch.Tensor]:
    """Seeded random weights in stored dtypes, one generator per tensor name (order-free)."""
    return {n: _random_tensor(n, s, cfg, seed) for n, s in expected_shapes(cfg).items()}


def _map_name(name: str) -> str | None:
    if name.startswith(SKIP_PREFIXES):
        return None
    for prefix in ("model.language_model.", "model."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name if name == "lm_head.weight" else None


def _shard_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / f for f in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors files")
    return files


def read_hf_tensors(path: Path, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Text-model tensors of a HF directory, by stripped name, in their stored dtypes.

    Raises ValueError naming the tensor for a missing or mis-shaped tensor.
    """
    want = expected_shapes(cfg)
    got: dict[str, torch.Tensor] = {}
    for file in _shard_files(path):
        with safe_open(str(file), framework="pt") as f:
            for raw in f.keys():
                name = _map_name(raw)
                if name is None or name not in want:
                    continue
                t = f.get_tensor(raw)
                if tuple(t.shape) != want[name]:
                    raise ValueError(f"tensor {raw!r} in {file.name}: checkpoint shape "
                                     f"{list(t.shape)}, expected {list(want[name])}")
                got[name] = t
    missing = sorted(set(want) - set(got))
    if missing:
        raise ValueError(f"{path}: missing tensor {missing[0]!r} (shape {list(want[missing[0]])})"
                         + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
    return got


def default_dtype(device: torch.device) -> torch.dtype:
    """float32 on the CPU, bfloat16 on CUDA."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def build_model(cfg: ModelConfig, tensors: dict[str, torch.Tensor], info: ModelInfo,
                device="cpu", dtype=None, kernels: str | None = None) -> Qwen35:
    """A Qwen35 on `device` in `dtype` (A_log and the GDN norm stay fp32) from stored tensors."""
    device = torch.device(device)
    dtype = dtype or default_dtype(device)
    with torch.device("meta"):
        model = Qwen35(cfg, select_kernels(device, kernels), info)
    state = {n: t.to(device=device, dtype=torch.float32 if n.endswith(FP32_SUFFIXES) else dtype)
             for n, t in tensors.items()}
    model.load_state_dict(state, assign=True, strict=True)
    return model.eval().requires_grad_(False)


def _banner(name: str) -> None:
    line = "!" * 78
    print(f"{line}\n!! shadow-reader: model '{name}' has SEEDED RANDOM WEIGHTS.\n"
          f"!! Speed, memory and exactness are real; answers are meaningless.\n{line}",
          file=sys.stderr)


def load_model(spec: str, device="cpu", dtype=None, kernels: str | None = None) -> Qwen35:
    """Load a model from a HF directory or `random:NAME` (NAME in tiny, qwen3.5-0.8b, -2b, -4b).

    Args: spec; device ("cpu", "cuda", torch.device); dtype (default float32 on CPU, bfloat16 on
    CUDA); kernels ("torch" or "fla"; default by device).
    Raises ValueError for an unknown preset or a bad checkpoint, FileNotFoundError for a missing
    directory or config.json.
    """
    if spec.startswith("random:"):
        name = spec[len("random:"):]
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        cfg = PRESETS[name]
        tensors = random_tensors(cfg)
        _banner(spec)
        info = ModelInfo(spec, fingerprint(tensors), True)
    else:
        path = Path(spec).expanduser()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path}: no config.json (expected a Hugging Face model dir)")
        cfg = ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
        tensors = read_hf_tensors(path, cfg)
        info = ModelInfo(str(path), fingerprint(tensors), False)
    return build_model(cfg, tensors, info, device, dtype, kernels)
