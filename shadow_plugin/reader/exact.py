"""The exactness oracle: a fresh prefill of ids[:C] on the grid by its own plain loop.

It shares no state-handling code with the reader (no SessionState, no page store, no
checkpoints), only the adapter's chunk forward, so it can catch the reader's mistakes.
"""
from __future__ import annotations

import torch

from adapters import Adapter
from block_store import ExactnessError, compare, contiguous_kv, pack, state_names

__all__ = ["ExactnessError", "compare", "fresh_prefill", "state_names"]


def fresh_prefill(adapter: Adapter, ids: list[int]) -> dict[str, torch.Tensor]:
    """State after prefilling `ids` (len a multiple of the adapter's grid) chunk by chunk from
    zero through `adapter.read_chunk` (the reader's own chunk forward): name -> tensor as
    block_store.pack names them."""
    spec, grid, n = adapter.spec, adapter.grid, len(ids)
    assert n % grid == 0, "fresh_prefill takes whole chunks"
    dev, dt = spec.device, spec.dtype
    kv = contiguous_kv(spec, grid, n)            # its own pool, pages in order
    kv.pool.block.zero_()
    gdn = [(torch.zeros(spec.conv_dim, spec.conv_width, device=dev, dtype=dt),
            torch.zeros(spec.recurrent_shape, device=dev, dtype=torch.float32))
           for _ in range(spec.num_gdn)]
    for start in range(0, n, grid):
        gdn = adapter.read_chunk(ids[start:start + grid], start, kv, gdn)
    return pack(spec, kv.gather(n), gdn, n)
