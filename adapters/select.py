"""The one place that decides how a reader's forwards run: the CUDA-graph runners or eager."""
from __future__ import annotations

from adapters.eager import EagerAdapter
from adapters.graphed import GraphAdapter
from adapters.interface import Adapter
from adapters.model.qwen35 import Qwen35


def make_adapter(model: Qwen35, grid: int, cuda_graphs: bool | None = None,
                 fused_ops: bool | None = None, attn_split=None,
                 attention: str | None = None, row_invariant: bool | None = None) -> Adapter:
    """cuda_graphs: the runners (GraphAdapter; default: on CUDA; on the CPU their bodies run
    without graphs), else Qwen35.forward (EagerAdapter). fused_ops (the runners' small ops
    through torch.compile; default: on CUDA), attn_split (the table attention's tiling, a
    SplitConfig; setting it picks the table attention) and attention (runners.graphs.ATTENTIONS;
    default: 'fa4' on Hopper where flash-attn-4 imports, else 'table') and row_invariant (the
    chunk runner's norms and row-wise ops through model.rowwise, runners.Runners; default: on
    CUDA with the compiled ops) choose how the runners work. Raises ValueError for an
    attention this device cannot run ('flash', removed with the pages, anywhere), a tiling
    that is not a SplitConfig, or any runner option without the runners."""
    if attention == "flash":
        raise ValueError("attention 'flash' (torch's FlashAttention-2) is no longer one of the "
                         "runners': it reads no page table, and KV lives in pages; use 'table' "
                         "(or 'fa4' on a Hopper GPU)")
    if cuda_graphs is None:                 # on by default on CUDA
        cuda_graphs = model.device.type == "cuda"
    if not cuda_graphs and (attention, attn_split, fused_ops, row_invariant) != (None,) * 4:
        raise ValueError(f"attention={attention!r}, attn_split={attn_split!r}, "
                         f"fused_ops={fused_ops!r} and row_invariant={row_invariant!r} choose "
                         f"how the CUDA-graph runners work; "
                         f"with cuda_graphs off the reader reads through Qwen35.forward "
                         f"(SDPA): leave them unset")
    from adapters.attention.tiling import SplitConfig
    if attn_split is not None and not isinstance(attn_split, SplitConfig):
        raise ValueError(f"attn_split must be an attention.tiling.SplitConfig (SplitConfig.parse"
                         f"('128x32x8x2')), got {type(attn_split).__name__}")
    if not cuda_graphs:
        return EagerAdapter(model, grid)
    return GraphAdapter(model, grid, attention, fused=fused_ops, split=attn_split,
                        row_invariant=row_invariant)
