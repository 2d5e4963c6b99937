"""KV rows of one attention layer read and written through a page table (block_store.memory.kv_pool:
pools [num_pages, G, Hkv, D], a sequence's pages in row order), for the pure-torch paths:
Attention.attend (SDPA) and its twins. Row r of the sequence lies at page table[r // G],
offset r % G. The CUDA paths read the pages in place (attention.table, attention.fa4).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LayerPages:
    """k, v: one attention layer's pools [num_pages, G, Hkv, D] (contiguous); table: [n]
    int64 page indices on their device, rows [0, n G) of the sequence."""

    k: torch.Tensor
    v: torch.Tensor
    table: torch.Tensor

    @property
    def page_rows(self) -> int:
        return self.k.shape[1]

    def index(self, start: int, end: int) -> torch.Tensor:
        """[end - start] int64: the pool rows (in the [num_pages * G] view) of sequence rows
        [start, end). Raises ValueError past the table."""
        g = self.page_rows
        if end > self.table.shape[0] * g or start < 0:
            raise ValueError(f"rows [{start}, {end}) past {self.table.shape[0]} pages of {g}")
        r = torch.arange(start, end, device=self.table.device)
        return self.table[r // g] * g + r % g

    def write(self, pos: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [T, Hkv, D] into sequence rows [pos, pos + T)."""
        idx = self.index(pos, pos + k.shape[0])
        self.k.view(-1, *self.k.shape[2:]).index_copy_(0, idx, k.to(self.k.dtype))
        self.v.view(-1, *self.v.shape[2:]).index_copy_(0, idx, v.to(self.v.dtype))

    def rows(self, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of sequence rows [0, end): (k, v) each [end, Hkv, D], contiguous."""
        idx = self.index(0, end)
        return (self.k.view(-1, *self.k.shape[2:])[idx],
                self.v.view(-1, *self.v.shape[2:])[idx])


def layer_pages(kv, table: torch.Tensor | None = None) -> list[LayerPages]:
    """Per attention layer a LayerPages over a block_store.PagedKv (table: its page table on
    the device, built when not given)."""
    table = kv.table() if table is None else table
    return [LayerPages(k, v, table) for k, v in kv.pool.layers()]
