"""The forward at page granularity: Qwen3.5 (adapters.model: layers, weights and presets, the
pure-torch, fla, Triton table and FlashAttention-4 kernels, the CUDA-graph runners, the decode
loop) behind one interface (adapters.interface.Adapter) that the reader calls for every forward."""
from adapters.eager import EagerAdapter, ReferenceAdapter
from adapters.graphed import GraphAdapter
from adapters.interface import ROW_ALIGN, Adapter, Decoded, spec_for, state_spec
from adapters.model import PRESETS, ModelConfig, ModelInfo, Qwen35, load_model
from adapters.select import make_adapter

__all__ = ["PRESETS", "ROW_ALIGN", "Adapter", "Decoded", "EagerAdapter", "GraphAdapter",
           "ModelConfig", "ModelInfo", "Qwen35", "ReferenceAdapter", "load_model",
           "make_adapter", "spec_for", "state_spec"]
