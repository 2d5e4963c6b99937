"""Qwen3.5 text model: config, layers, reference and fla kernels, weights."""
from adapters.model.config import PRESETS, ModelConfig
from adapters.model.qwen35 import ModelInfo, Qwen35
from adapters.model.weights import load_model

__all__ = ["PRESETS", "ModelConfig", "ModelInfo", "Qwen35", "load_model"]
