"""The paged KV cache's memory: every attention layer's K and V rows in fixed pages of G rows
(the grid), one allocation for all layers, with the block manager (pool.PagePool) keeping
their references, keys and free queue.

Layout: block [num_attention, 2, num_pages, G, Hkv, D] in the spec's dtype on its device;
`layer(j)` gives attention layer j's (k, v), each [num_pages, G, Hkv, D] (the page pool form
FlashAttention-4's `page_table` takes; a page may be read as G / s sub-pages of s rows, the
same memory). A sequence's KV is a list of page indices in row order (`PagedKv`): row r lies
in page pages[r // G] at offset r % G. Pages are never copied to be read; a page's bits do
not depend on where it lies.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from block_store.memory.layout import StateSpec
from block_store.memory.pool import PagePool


class KvPool:
    """Args: spec (the states' layouts); page_rows (G); num_pages: pages allocated now (more
    come with `grow`). Raises ValueError for a page size that is not a positive multiple of
    64 or a negative count."""

    def __init__(self, spec: StateSpec, page_rows: int, num_pages: int = 0):
        if page_rows < 64 or page_rows % 64:
            raise ValueError(f"page_rows must be a positive multiple of 64, got {page_rows}")
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        self.spec, self.page_rows = spec, page_rows
        self.manager = PagePool(num_pages)
        self._set_block(self._alloc(num_pages))

    def _alloc(self, num_pages: int) -> torch.Tensor:
        s = self.spec
        return torch.empty(s.num_attention, 2, num_pages, self.page_rows, *s.kv_row_shape,
                           device=s.device, dtype=s.dtype)

    @property
    def num_pages(self) -> int:
        return len(self.manager.pages)

    @property
    def page_bytes(self) -> int:
        """Bytes of one page across every attention layer, K and V."""
        s = self.spec
        return 2 * s.num_attention * self.page_rows * s.num_kv_heads * s.head_dim * \
            torch.empty(0, dtype=s.dtype).element_size()

    @property
    def nbytes(self) -> int:
        return self.block.nbytes

    def layer(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention layer j's (k, v) pools, each [num_pages, G, Hkv, D] (views, kept: building
        them cost the host about 9 us a layer on the 2-core development machine's CPU, timeit,
        2026-12-02, and the FA4 path asks for them every layer of every chunk)."""
        return self._layers[j]

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(self._layers)

    def _set_block(self, block: torch.Tensor) -> None:
        """block, its per-layer views and their addresses (k, v of every layer in layer
        order; a runner stages them as offsets from its base, adapters.runners.meta, and keeps
        those while this list stays the same object)."""
        self.block = block
        self._layers = [(block[j, 0], block[j, 1]) for j in range(self.spec.num_attention)]
        self.pointers = [x.data_ptr() for pair in self._layers for x in pair]

    def copy_page(self, src: int, dst: int) -> None:
        """Page `dst`'s rows of every layer, K and V, set to page `src`'s (one strided copy on
        the pool's device; a fork's own copy of a page it writes above rows another holds)."""
        self.block[:, :, dst].copy_(self.block[:, :, src])

    def grow(self, num_pages: int) -> None:
        """Hold `num_pages` pages (more than now): a new block, the old pages copied in (their
        indices, keys and references unchanged). Raises ValueError for fewer pages."""
        if num_pages < self.num_pages:
            raise ValueError(f"a pool of {self.num_pages} pages cannot shrink to {num_pages}")
        if num_pages == self.num_pages:
            return
        new = self._alloc(num_pages)
        if self.num_pages and new.numel():
            new[:, :, :self.num_pages].copy_(self.block)
        self._set_block(new)
        self.manager.grow(num_pages)

@dataclass
class PagedKv:
    """One sequence's KV rows: rows [0, len(pages) * G) in pages `pages` (indices into
    `pool`, in row order). What the adapters' forwards take instead of contiguous buffers."""

    pool: KvPool
    pages: list[int]

    @property
    def page_rows(self) -> int:
        return self.pool.page_rows

    @property
    def num_rows(self) -> int:
        return len(self.pages) * self.pool.page_rows

    def table(self, device=None) -> torch.Tensor:
        """[num_pages] int64 page indices on `device` (default the pool's)."""
        return torch.tensor(self.pages, dtype=torch.long, device=device or self.pool.spec.device)

    def gather(self, rows: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of rows [0, rows) per attention layer, (k, v) each [rows, Hkv, D] contiguous
        (for the pure-torch paths, files and tests; the CUDA paths read pages in place).
        Raises ValueError when the pages hold fewer rows."""
        if rows > self.num_rows:
            raise ValueError(f"{rows} rows asked of {len(self.pages)} pages of "
                             f"{self.page_rows}")
        n = -(-rows // self.page_rows)
        idx = self.table()[:n]
        return [(k[idx].flatten(0, 1)[:rows], v[idx].flatten(0, 1)[:rows])
                for k, v in self.pool.layers()]


def contiguous_kv(spec: StateSpec, page_rows: int, rows: int) -> PagedKv:
    """A PagedKv of its own pool with pages 0, 1, ... in order, room for `rows` rows (what a
    fresh prefill and tests use)."""
    n = -(-rows // page_rows)
    pool = KvPool(spec, page_rows, n)
    for _ in range(n):
        pool.manager.allocate()
    return PagedKv(pool, list(range(n)))


def put_pages(pool: KvPool, pages: Sequence[int], kv: torch.Tensor) -> None:
    """Write kv [n, num_attention, 2, G, Hkv, D] (any device; page j's rows of every layer)
    into the n pages `pages`: one copy to the device, one indexed copy (a load from disk).
    Raises ValueError for rows of another shape."""
    n = len(pages)
    want = (n, *pool.block.shape[:2], *pool.block.shape[3:])
    if tuple(kv.shape) != want:
        raise ValueError(f"{n} pages need kv of shape {want}, got {tuple(kv.shape)}")
    if n:
        idx = torch.tensor(list(pages), dtype=torch.long, device=pool.spec.device)
        src = kv.to(pool.spec.device, non_blocking=kv.is_pinned())   # ordered on the stream
        pool.block.index_copy_(2, idx, src.movedim(0, 2))


def put_page(pool: KvPool, page: int, kv: torch.Tensor) -> None:
    """Write kv [num_attention, 2, G, Hkv, D] (any device; one page's rows of every layer)
    into page `page`: one copy, asynchronous from page-locked memory (no index tensor made on
    the device: nothing waits). Raises ValueError for rows of another shape."""
    want = (*pool.block.shape[:2], *pool.block.shape[3:])
    if tuple(kv.shape) != want:
        raise ValueError(f"a page needs kv of shape {want}, got {tuple(kv.shape)}")
    pool.block[:, :, page].copy_(kv, non_blocking=kv.is_pinned())


def pages_to_cpu(pool: KvPool, pages: Sequence[int], pinned: bool = False) -> torch.Tensor:
    """Copies of the pages' rows on the CPU, kv [n, num_attention, 2, G, Hkv, D] (page j's
    rows contiguous: what a page file holds), in page-locked memory when `pinned`; one
    indexed gather and one copy (a spill)."""
    idx = torch.tensor(list(pages), dtype=torch.long, device=pool.spec.device)
    rows = pool.block.index_select(2, idx).movedim(2, 0).contiguous()
    out = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=pinned)
    return out.copy_(rows)
