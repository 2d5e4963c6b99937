"""What varies between a runner's chunks, staged where its CUDA graphs read it (runners.graphs).

One int64 buffer `meta` on the model's device:
    [ids (T) | pos | per full-attention layer j: the k and v pools' element offsets from
     `pool_base` (2) | the sequence's page table (MAX_TABLE_PAGES) | with FA4: its plan's
     page tables of 64-row sub-pages (int32, 16-byte aligned)]
filled from pinned memory (only the parts in use) by one copy before the chunk's first graph
(`stage`) and, with FA4, one after that graph's launch (`stage_plan`), so a chunk's graphs
run for any session, position and pool without being captured again.

Why offsets from a base tensor and not the pools' addresses: Triton's kernels make a pointer of
an int64 read from memory without alignment facts, and then do not vectorise their loads
(a probe copy of attention.table's decode kernel took 0.089 ms a layer at 100k that way, 0.061
from a base; H200, evals/decode_variants.py at cadb457, docs/decode-ptr-2026-12-02.log). `pool_base`
is a tensor of the pools' dtype kept for the runner's life, so the offsets, multiples of 16
bytes, stay valid for the captured graphs.
"""
from __future__ import annotations

import functools
import struct

import numpy as np
import torch

from adapters.attention import fa4 as fa4_attention

MAX_TABLE_PAGES = 4096           # most pages a sequence's table holds in a runner's meta


@functools.lru_cache(maxsize=None)
def _pack(n: int) -> struct.Struct:
    """n native int64s (meta's host memory is a numpy int64 array of the machine's order)."""
    return struct.Struct(f"={n}q")


class ChunkMeta:
    """Args: t (ids a chunk), num_full (full-attention layers), page_rows (G), device, dtype
    (the pools'), fa4: the runner's attention.fa4.FA4Attention when it attends with FA4 between
    its graphs (its page tables are staged too), else None; sub_pages: positions must be
    multiples of FA4's 64-row sub-pages (implied by fa4)."""

    def __init__(self, t: int, num_full: int, page_rows: int, device: torch.device,
                 dtype: torch.dtype, fa4=None, sub_pages: bool = False):
        self.t, self.page_rows, self.fa4 = t, page_rows, fa4
        self.sub_pages = sub_pages or fa4 is not None
        self.table_at = t + 1 + 2 * num_full              # the page table starts here
        # FA4's tables after the page table's every slot (16-byte aligned): `stage` and
        # `stage_plan` write and copy parts of the pinned buffer that never overlap
        self.plan_at = self.table_at + MAX_TABLE_PAGES
        self.plan_at += self.plan_at % 2
        # FA4's sub-page tables (int32): int64 slots for half the int32 entries, rounded up
        fa4_slots = -(-fa4_attention.plan_size(MAX_TABLE_PAGES * page_rows, page_rows) // 2) \
            if fa4 is not None else 0
        self.meta = torch.zeros(self.plan_at + fa4_slots, device=device, dtype=torch.long)
        cuda = device.type == "cuda"
        host = torch.zeros_like(self.meta, device="cpu")
        self.host = host.pin_memory() if cuda else host
        self.host_np = self.host.numpy()       # the same memory, written without torch calls
        self.host_bytes = memoryview(self.host_np).cast("B")
        # the last copy out of each part of the pinned buffer: stage's, and stage_plan's
        self.copied = torch.cuda.Event() if cuda else None
        self.plan_copied = torch.cuda.Event() if cuda else None
        self.pool_base = torch.zeros(8, device=device, dtype=dtype)
        self._places: tuple = (None, [])       # (a pool's pointers, their offsets)
        self.num_pages, self.staged_pos = 0, 0

    @property
    def pos(self) -> torch.Tensor:
        """[1] int64: the chunk's first position."""
        return self.meta[self.t:self.t + 1]

    def places(self, j: int) -> torch.Tensor:
        """[2] int64: full-attention layer j's k and v pools as element offsets from
        pool_base."""
        return self.meta[self.t + 1 + 2 * j:self.t + 3 + 2 * j]

    def table(self, num_pages: int | None = None) -> torch.Tensor:
        """[num_pages] int64 (default: every slot): the page table."""
        end = self.table_at + (MAX_TABLE_PAGES if num_pages is None else num_pages)
        return self.meta[self.table_at:end]

    def stage(self, ids, pos: int, kv) -> None:
        """ids (a list of T ints, or a [T] int64 tensor), pos, the pools' offsets and the page
        table of kv (a block_store.PagedKv) into meta: one copy from pinned memory (after the
        last copy has read it). FA4's plan comes after (`stage_plan`). Raises ValueError for
        a pool not 16-byte aligned or of another dtype (`pool_places`), or, with FA4, a pos
        off its 64-row sub-pages, before anything is written."""
        places = self.pool_places(kv.pool)
        if self.sub_pages:
            fa4_attention.fa4_plan.check_rows(pos, self.t)
        if self.copied is not None:
            self.copied.synchronize()
        t, host, at = self.t, self.host_np, self.table_at
        n = len(kv.pages)
        try:
            if isinstance(ids, list):
                _pack(t).pack_into(self.host_bytes, 0, *ids)   # 3x numpy's list conversion
            else:
                self.host[:t].copy_(ids)
            _pack(n).pack_into(self.host_bytes, at * 8, *kv.pages)
        except struct.error as e:             # nothing copied yet: the device holds the last
            raise ValueError(f"ids and page indices must be int64 integers: {e}") from None
        host[t] = pos
        host[t + 1:at] = places
        self.num_pages, self.staged_pos = n, pos
        self.meta[:at + n].copy_(self.host[:at + n], non_blocking=True)
        if self.copied is not None:
            self.copied.record()

    def stage_plan(self):
        """FA4's plan (attention.fa4.Plan) of the chunk `stage` staged: its page tables into meta
        after the page table's slots (16-byte aligned), in a copy of their own on the current
        stream. The runner calls it after launching its first graph, which does not read
        them, so the host builds them while the GPU runs (at 96k about 40 us of the host's
        time before a chunk's first kernel, timeit on the development CPU)."""
        at, n, host, fa4 = self.table_at, self.num_pages, self.host_np, self.plan_at
        if self.plan_copied is not None:
            self.plan_copied.synchronize()   # the last chunk's plan copy has read its part
        plan, used = self.fa4.plan_into(self.staged_pos, self.t, host[at:at + n],
                                        self.page_rows, host[fa4:].view(np.int32),
                                        self.meta[fa4:].view(torch.int32))
        end = fa4 + -(-used // 2)
        self.meta[fa4:end].copy_(self.host[fa4:end], non_blocking=True)
        if self.plan_copied is not None:
            self.plan_copied.record()
        return plan

    def pool_places(self, pool) -> list[int]:
        """The pool's k and v element offsets from pool_base per attention layer (kept while
        the pool's addresses stay: `pool.pointers` is replaced when it grows). Raises
        ValueError for a pool not 16-byte aligned or of another dtype."""
        if self._places[0] is not pool.pointers:
            base, size = self.pool_base.data_ptr(), self.pool_base.element_size()
            odd = [p for p in pool.pointers if (p - base) % 16]
            if odd or pool.block.dtype != self.pool_base.dtype:
                raise ValueError(f"pools of {pool.block.dtype} at {pool.block.data_ptr():#x}"
                                 f"{f' (a layer at {odd[0]:#x})' if odd else ''}: the kernels "
                                 f"need {self.pool_base.dtype}, 16-byte aligned")
            self._places = (pool.pointers, [(p - base) // size for p in pool.pointers])
        return self._places[1]
