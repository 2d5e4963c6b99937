"""The eager paths: Qwen35.forward chunk by chunk, no graphs, no runners.

EagerAdapter uses the model's own kernel set (fla on CUDA, the pure-torch kernels on the CPU);
ReferenceAdapter uses the pure-torch kernels (adapters.model.ref: chunked GDN in fp32, SDPA
attention) on any device: the CPU path, and the oracle the fast paths are tested against.
Both take `path` 'eager'; the kernel set's name tells them apart in a file's identity.

Batches (`read_chunks`, `fork_logits_batch`) run in one forward (Qwen35.forward_batch) on the
CPU when its GEMMs give a row the same bits whatever the batch (`batches`: Qwen35.rows_invariant,
checked once per thread count with the model's own weights), else one at a time. Either way
each chunk gets the bits read_chunk gives it alone, so a batched read keeps the path 'eager'
and the committed states, page keys and spilled files of reads one at a time. A question
alone runs its projections over rows padded to a multiple of model.batch.ROW_TILE (what it
meets in a batch): the same bits as before for questions of 12 ids or more on the CPUs
measured (model.batch), other bits below that (no committed state depends on them).

On CUDA, cuBLAS picks its kernels by the row count, so a chunk batched would get other bits
than alone: there an adapter batches only with `invariant=True`, which sends every projection,
alone and batched, through model.invariant.linear (a Triton GEMM whose rows' bits depend on
nothing but the row; its row-invariant twin on the CPU), and names its path 'eager+bi': its
bits are not those of 'eager' (spilled files and page keys tell the two apart; never mixed).
It batches when the model's norms give a grid chunk's rows the same bits in a batch
(model.batch.norm_rows_invariant, checked once).

Either way a batch runs in one forward only where every row count it meets checks out on the
machine at hand (`_keeps_bits`, once per row count): its GEMMs' (the buffer's rows and each
sequence's padded alone) and its norms' (the buffer's rows against each sequence's own, as
its forward alone runs them: a batch of questions meets other counts than a batch of chunks).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from adapters.interface import Adapter, check_rows
from adapters.model.batch import ROW_TILE, RowTiles, norm_keeps_rows, norm_rows_invariant
from adapters.model.invariant import linear as invariant_linear
from adapters.model.kernels import TORCH, KernelSet
from adapters.model.qwen35 import Qwen35
from block_store import PagedKv
from block_store.memory.layout import GdnState


class EagerAdapter(Adapter):
    """Qwen35.forward for every forward (args: model, grid; kernels: the GDN kernel set,
    default the model's; invariant: every projection through model.invariant.linear, path
    'eager+bi', batches on CUDA too)."""

    def __init__(self, model: Qwen35, grid: int, kernels: KernelSet | None = None,
                 invariant: bool = False):
        super().__init__(model, grid)
        self._kernels = kernels or model.kernels
        self._linear = invariant_linear if invariant else None
        self._batches: dict[int, bool] = {}        # torch's threads -> rows_invariant
        # (torch's threads, a GEMM's row count) -> its rows keep their tile's bits
        self._row_counts: dict[tuple[int, int], bool] = {}
        # (torch's threads, a buffer's rows, a sequence's rows) -> the norms keep its bits
        self._norm_rows: dict[tuple[int, int, int], bool] = {}

    @property
    def kernels(self) -> KernelSet:
        return self._kernels

    @property
    def invariant(self) -> bool:
        """Whether the projections go through model.invariant.linear."""
        return self._linear is not None

    @property
    def path(self) -> str:
        return "eager+bi" if self.invariant else "eager"

    def read_chunk(self, ids: Sequence[int], pos: int, kv: PagedKv, gdn: GdnState) -> GdnState:
        _, new = self.model(self._ids(ids), pos, kv, gdn, self._kernels, linear=self._linear)
        return new

    def read_rows(self, ids: Sequence[int], pos: int, kv: PagedKv, gdn: GdnState) -> GdnState:
        check_rows(len(ids), pos, self.grid)
        _, new = self.model(self._ids(ids), pos, kv, gdn, self._kernels, linear=self._linear)
        return new

    def fork_logits(self, ids: Sequence[int], pos: int, kv: PagedKv, gdn: GdnState,
                    token_ids: Sequence[int]) -> torch.Tensor:
        hidden, _ = self.model(self._ids(ids), pos, kv, gdn, self._kernels, row_tile=ROW_TILE,
                               linear=self._linear)
        return self._letters(hidden, token_ids)

    def _letters(self, hidden: torch.Tensor, token_ids: Sequence[int]) -> torch.Tensor:
        """The last row's logits for token_ids: [len(token_ids)] fp32."""
        return self.model.logits(hidden[-1:], self._ids(token_ids))[0].float()

    def batches(self, lengths: Sequence[int] | None = None,
                positions: Sequence[int] | None = None,
                shared_rows: int | None = None) -> bool:
        """Whether a batch runs in one forward here: on the CPU, where the facts batching
        rests on were measured (model.batch), when Qwen35.rows_invariant holds at the grid's
        rows with the threads torch uses now (checked once per thread count); on CUDA only
        with the invariant linear (cuBLAS picks its kernels by the row count), when its rows
        and the norms' (model.batch.norm_rows_invariant) check out on the device, once. With
        lengths (two or more items' ids), also whether that batch's row counts keep their
        bits (`_keeps_bits`): the one answer read_chunks and fork_logits_batch act on. Items at
        several positions run in one forward here (Qwen35.forward_batch), each through its own
        rows: `positions` and `shared_rows` change nothing."""
        cpu = self.model.device.type == "cpu"
        if not (cpu or self.invariant):
            return False
        threads = torch.get_num_threads() if cpu else 0
        if threads not in self._batches:
            self._batches[threads] = self._rows_invariant()
        if not self._batches[threads]:
            return False
        return lengths is None or len(lengths) < 2 or self._keeps_bits(lengths)

    def _rows_invariant(self) -> bool:
        """The checks `batches` rests on, run on the machine at hand with the model's own
        weights (the GEMMs) and norm (its width and dtype)."""
        if not self.model.rows_invariant(self.grid, linear=self._linear):
            return False
        return self._linear is None or norm_rows_invariant(
            self.model.norm, self.model.cfg.hidden_size, self.grid, self.model.dtype,
            self.model.device)

    def _keeps_bits(self, lengths: Sequence[int]) -> bool:
        """Whether a batch of sequences of these lengths (ids) meets only GEMMs whose rows keep
        their tile's bits: the buffer's row count, and each sequence's padded alone
        (Qwen35.gemms_keep_tile_bits, checked once per row count and thread count; a CPU's
        GEMM may change kernels at any row count: model.batch); and norms over the buffer
        that give each sequence's rows the bits of the norms over its own rows, as its
        forward alone runs them (model.batch.norm_keeps_rows with the model's final norm, its
        width and dtype: once per buffer's rows, sequence's rows and thread count; a CUDA
        reduction picks its launch by the tensor's size)."""
        tiles = RowTiles(tuple(lengths))
        threads = torch.get_num_threads() if self.model.device.type == "cpu" else 0
        counts = {*tiles.padded, tiles.num_rows}
        for m in counts:
            if (threads, m) not in self._row_counts:
                self._row_counts[(threads, m)] = self.model.gemms_keep_tile_bits(
                    m, linear=self._linear)
        if not all(self._row_counts[(threads, m)] for m in counts):
            return False
        for n in sorted(set(lengths)):
            key = (threads, tiles.num_rows, n)
            if key not in self._norm_rows:
                self._norm_rows[key] = norm_keeps_rows(
                    self.model.norm, self.model.cfg.hidden_size, tiles.num_rows, n,
                    self.model.dtype, self.model.device)
            if not self._norm_rows[key]:
                return False
        return True

    def read_chunks(self, items) -> list[GdnState]:
        """One forward for all (Qwen35.forward_batch) when `batches` says so for these items'
        lengths, else one at a time."""
        if len(items) < 2 or not self.batches([len(item[0]) for item in items]):
            return super().read_chunks(items)
        _, states = self.model.forward_batch(
            [(self._ids(ids), pos, kv, gdn) for ids, pos, kv, gdn in items], self._kernels,
            linear=self._linear)
        self.num_batched_forwards += 1
        self.num_batched_chunks += len(items)
        return states

    def fork_logits_batch(self, items, shared_rows: int = 0) -> list[torch.Tensor]:
        """One forward for all (Qwen35.forward_batch) when `batches` says so for these items'
        lengths, else one at a time; each fork's logits from its own last row. shared_rows
        is not used (each fork reads its own pages)."""
        if len(items) < 2 or not self.batches([len(item[0]) for item in items]):
            return super().fork_logits_batch(items)
        hidden, _ = self.model.forward_batch(
            [(self._ids(ids), pos, kv, gdn) for ids, pos, kv, gdn, _ in items], self._kernels,
            linear=self._linear)
        return [self._letters(h, item[4]) for h, item in zip(hidden, items)]


class ReferenceAdapter(EagerAdapter):
    """EagerAdapter over the pure-torch kernels (adapters.model.kernels.TORCH) on any device."""

    def __init__(self, model: Qwen35, grid: int):
        super().__init__(model, grid, TORCH)
