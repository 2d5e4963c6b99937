"""Qwen3.5 text-model configuration: one frozen dataclass, built once from config.json or a preset.

Field names follow Hugging Face `Qwen3_5TextConfig`; shapes and values of the presets come from
docs/specs/qwen35.md section 1 (0.8B, 2B, 4B) and section 6 (the tiny CPU model).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

FULL = "full_attention"
LINEAR = "linear_attention"


@dataclass(frozen=True)
class ModelConfig:
    """Shapes of a Qwen3.5 text model.

    Derived sizes (properties): `key_dim = linear_num_key_heads * linear_key_head_dim`,
    `value_dim = linear_num_value_heads * linear_value_head_dim`, `conv_dim = 2 * key_dim + value_dim`,
    `rotary_dim = int(head_dim * partial_rotary_factor)`.
    """

    vocab_size: int = 248320
    hidden_size: int = 1024
    intermediate_size: int = 3584
    num_hidden_layers: int = 24
    layer_types: tuple[str, ...] = field(default_factory=tuple)
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 256
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 16
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    rope_theta: float = 1e7
    partial_rotary_factor: float = 0.25
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 262144
    eos_token_id: int = 248044

    def __post_init__(self) -> None:
        if not self.layer_types:
            # Hugging Face default: every 4th layer is full attention (full_attention_interval = 4).
            types = tuple(FULL if i % 4 == 3 else LINEAR for i in range(self.num_hidden_layers))
            object.__setattr__(self, "layer_types", types)
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries, "
                             f"num_hidden_layers is {self.num_hidden_layers}")
        bad = [t for t in self.layer_types if t not in (FULL, LINEAR)]
        if bad:
            raise ValueError(f"unknown layer type {bad[0]!r} (expected {FULL!r} or {LINEAR!r})")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    def kv_bytes_per_row(self, dtype_bytes: int) -> int:
        """Bytes of K and V for one token over all full-attention layers (0.8B bf16: 12,288)."""
        return len(self.full_layers) * 2 * self.num_key_value_heads * self.head_dim * dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layer_types"] = list(self.layer_types)
        return d

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> "ModelConfig":
        """Build from a Hugging Face config.json dict, with or without `text_config`.

        Raises ValueError when a required field is missing.
        """
        text = dict(raw.get("text_config") or raw)
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        kw: dict[str, Any] = {}
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "linear_num_key_heads",
                     "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                     "linear_conv_kernel_dim"):
            if name not in text:
                raise ValueError(f"config.json: missing field {name!r}")
            kw[name] = int(text[name])
        kw["head_dim"] = int(text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"])
        if text.get("layer_types"):
            kw["layer_types"] = tuple(text["layer_types"])
        elif text.get("full_attention_interval"):
            n = int(text["full_attention_interval"])
            kw["layer_types"] = tuple(FULL if (i + 1) % n == 0 else LINEAR
                                      for i in range(kw["num_hidden_layers"]))
        kw["rope_theta"] = float(rope.get("rope_theta", text.get("rope_theta", 1e7)))
        kw["partial_rotary_factor"] = float(rope.get("partial_rotary_factor",
                                                     text.get("partial_rotary_factor", 0.25)))
        kw["rms_norm_eps"] = float(text.get("rms_norm_eps", 1e-6))
        tie = text.get("tie_word_embeddings", raw.get("tie_word_embeddings", True))
        kw["tie_word_embeddings"] = bool(tie)
        kw["max_position_embeddings"] = int(text.get("max_position_embeddings", 262144))
        eos = text.get("eos_token_id", raw.get("eos_token_id", 248044))
        kw["eos_token_id"] = int(eos[0] if isinstance(eos, list) else eos)
        return cls(**kw)

    def to_hf(self) -> dict[str, Any]:
        """A `qwen3_5_text` config.json dict that transformers' Qwen3_5ForCausalLM accepts."""
        half = self.rotary_dim // 2
        section = [half - 2 * (half // 3), half // 3, half // 3]
        return {
            "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers, "layer_types": list(self.layer_types),
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta,
                                "partial_rotary_factor": self.partial_rotary_factor,
                                "mrope_section": section, "mrope_interleaved": True},
            "rms_norm_eps": self.rms_norm_eps, "hidden_act": "silu",
            "attention_bias": False, "attn_output_gate": True,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "eos_token_id": self.eos_token_id, "torch_dtype": "bfloat16",
        }


# Real shapes (docs/specs/qwen35.md section 1) and a tiny CI model with the real vocabulary.
PRESETS: dict[str, ModelConfig] = {
    "qwen3.5-0.8b": ModelConfig(),
    "qwen3.5-2b": ModelConfig(hidden_size=2048, intermediate_size=6144),
    "qwen3.5-4b": ModelConfig(hidden_size=2560, intermediate_size=9216, num_hidden_layers=32,
                              num_attention_heads=16, num_key_value_heads=4,
                              linear_num_value_heads=32),
    # Both layer types, value heads = 2 x key heads (the 4B head mapping), real vocabulary.
    "tiny": ModelConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                        linear_num_key_heads=2, linear_num_value_heads=4,
                        linear_key_head_dim=32, linear_value_head_dim=32),
    # The tiny shape with GDN key/value head dims of 128: vLLM's CPU GDN kernel refuses 32, so
    # this is the host model of the vLLM tests (shadow-reader export-model random:tiny-host DIR).
    "tiny-host": ModelConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                             linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=128, linear_value_head_dim=128),
}


def spec_for(cfg: ModelConfig, device, dtype):
    """The layouts of a session's state for a model of config `cfg` (block_store.StateSpec),
    states on `device` in `dtype` (recurrent states fp32)."""
    from block_store.memory.layout import ATTENTION, GDN, StateSpec
    return StateSpec(tuple(ATTENTION if t == FULL else GDN for t in cfg.layer_types),
                     cfg.num_key_value_heads, cfg.head_dim, cfg.conv_dim,
                     cfg.linear_conv_kernel_dim, cfg.linear_num_value_heads,
                     cfg.linear_key_head_dim, cfg.linear_value_head_dim, dtype, device)
