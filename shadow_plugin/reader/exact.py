"""The exactness oracle: a fresh prefill of ids[:C] on the grid by its own plain loop.

It shares no state-handling code with the reader (no SessionState, no page store, no
checkpoints), only the adapter's chunk forward, so it can catch the reader's mistakes. The
loop can be run a chunk at a time (`begin_fresh`, `fresh_step`, `fresh_state`): a caller may
let its lock go between two chunks (a check of a long session, Reader.begin_check); the fresh
prefill holds its own KV and states, so the bits are the same however the steps are spread.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from adapters import Adapter
from block_store import ExactnessError, PagedKv, compare, contiguous_kv, pack, state_names
from block_store.memory.layout import GdnState

__all__ = ["ExactnessError", "FreshPrefill", "begin_fresh", "compare", "fresh_prefill",
           "fresh_state", "fresh_step", "state_names"]


@dataclass
class FreshPrefill:
    """A fresh prefill in progress: ids (a multiple of the grid), its own KV (`kv`: a pool of
    its own, pages in order, zeroed), the GDN states after row pos - 1 (per GDN layer (conv
    [conv_dim, W] of the model's dtype, recurrent [HV, K, V] fp32)), pos: the next chunk's
    first row (a grid line)."""

    ids: list[int]
    kv: PagedKv
    gdn: GdnState
    pos: int = 0


def begin_fresh(adapter: Adapter, ids: list[int]) -> FreshPrefill:
    """A fresh prefill of `ids` (len a multiple of the adapter's grid; AssertionError else)
    from zero states and zeroed KV, nothing read yet."""
    spec, grid, n = adapter.spec, adapter.grid, len(ids)
    assert n % grid == 0, "fresh_prefill takes whole chunks"
    dev, dt = spec.device, spec.dtype
    kv = contiguous_kv(spec, grid, n)            # its own pool, pages in order
    kv.pool.block.zero_()
    gdn = [(torch.zeros(spec.conv_dim, spec.conv_width, device=dev, dtype=dt),
            torch.zeros(spec.recurrent_shape, device=dev, dtype=torch.float32))
           for _ in range(spec.num_gdn)]
    return FreshPrefill(list(ids), kv, gdn)


def fresh_step(adapter: Adapter, fp: FreshPrefill) -> bool:
    """Read the next chunk through `adapter.read_chunk` (the reader's own chunk forward), when
    one is left; returns whether chunks are left after it."""
    grid = adapter.grid
    if fp.pos < len(fp.ids):
        fp.gdn = adapter.read_chunk(fp.ids[fp.pos:fp.pos + grid], fp.pos, fp.kv, fp.gdn)
        fp.pos += grid
    return fp.pos < len(fp.ids)


def fresh_state(adapter: Adapter, fp: FreshPrefill) -> dict[str, torch.Tensor]:
    """The state after the prefill (every chunk read; AssertionError else): name -> tensor as
    block_store.pack names them (KV rows [len(ids), ...] gathered, the GDN states)."""
    n = len(fp.ids)
    assert fp.pos == n, f"{(n - fp.pos) // adapter.grid} chunks not read"
    return pack(adapter.spec, fp.kv.gather(n), fp.gdn, n)


def fresh_prefill(adapter: Adapter, ids: list[int]) -> dict[str, torch.Tensor]:
    """State after prefilling `ids` (len a multiple of the adapter's grid) chunk by chunk from
    zero through `adapter.read_chunk` (the reader's own chunk forward): name -> tensor as
    block_store.pack names them. The steps of begin_fresh, fresh_step and fresh_state in one
    call."""
    fp = begin_fresh(adapter, ids)
    while fresh_step(adapter, fp):
        pass
    return fresh_state(adapter, fp)
