"""Qwen3.5 text model: config, layers, reference and fla kernels, weights."""
from .config import PRESETS, ModelConfig
from .qwen35 import ModelInfo, Qwen35
from .weights import load_model

__all__ = ["PRESETS", "ModelConfig", "ModelInfo", "Qwen35", "load_model"]
