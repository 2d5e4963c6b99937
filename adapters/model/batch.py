"""Batch invariance: what lets several sequences share one forward's dense ops
(Qwen35.forward_batch) while every row gets the bits it gets in its own forward.

A sequence's rows lie in one buffer of all the batch's rows (`RowTiles`), each sequence's rows
starting at a multiple of ROW_TILE and padded to one, so that every row meets the same
kind of GEMM alone or batched: a row count that is a multiple of ROW_TILE. What each op does to
a row's bits, measured on the CPU (torch 2.13, MKL, AVX-512; 1, 2, 3 and 4 threads; fp32 and
bf16; the tiny and the 0.8B shapes; tests/unit/test_batch_invariance.py keeps the facts the
batched forward relies on):
- F.linear (sgemm, bf16 gemm): a row's bits depend on the GEMM's row count M only for small M:
  in fp32 M <= 3 (one thread) and M in 5-11 not a multiple of 4 (two threads) gave other
  bits than the same row in a GEMM of 2,048 rows; every M from 12 up and every multiple of 64
  gave the same bits at any offset. So a sequence's rows go through GEMMs of a multiple of
  ROW_TILE rows alone (`tiled_linear`) and batched (the buffer's rows): the same bits; and a
  grid chunk (a multiple of 64 ids) needs no padding, so the batched read gives the alone
  read's bits (Qwen35.rows_invariant checks it on the machine at hand, with the model's own
  weights, before an adapter batches).
  Another CPU need not keep this: on a Xeon with AMX and AVX-512-FP16 (torch 2.13, oneDNN;
  2026-12-05) the 0.8B's shapes gave a 64-row block other bits in GEMMs of 192 rows and more
  (bf16 at one and two threads, fp32 at two; the tiny model's shapes did not): there
  `linear_rows_invariant` says no, and the reader reads one session at a time.
- RMSNorm: a reduction per row and correctly rounded elementwise ops: the same bits at any row
  count (measured too).
- SiLU and sigmoid (exp): torch's CPU kernels compute whole vectors with Sleef's exp and the
  last elements of each thread's share with the C library's; the share depends on the
  tensor's size, so with 3 threads rows of a concatenation got other bits than alone (fp32;
  1 and 2 threads did not show it). The batched forward runs them per sequence, on the same
  rows as alone (so do RoPE, attention, the GDN conv, gates and recurrence: per sequence,
  through its own pages and states).
On CUDA, cuBLAS picks kernels (and split-K) by M: the batched path there runs every
projection through model.invariant's linear (fixed tiles, no split-K, M not specialized), alone
and batched (adapters.eager.EagerAdapter(invariant=True), path 'eager+bi'), and batches only
where `norm_rows_invariant` holds too (the norms are one reduction per row, but torch's CUDA
reduction picks its launch by the tensor's size; evals/bi_bench.py measures it on the H200).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

ROW_TILE = 64


@dataclass(frozen=True)
class RowTiles:
    """Where B sequences' rows lie in one buffer: sequence b's `lengths[b]` rows from
    `offsets[b]` (a multiple of `tile`), padded to `padded[b]` rows (the next multiple of
    `tile`); `num_rows` in all. Raises ValueError for no sequence, a length below 1 or a tile
    below 1."""

    lengths: tuple[int, ...]
    tile: int = ROW_TILE

    def __post_init__(self) -> None:
        if not self.lengths or any(n < 1 for n in self.lengths):
            raise ValueError(f"a batch needs sequences of at least one row, got {self.lengths}")
        if self.tile < 1:
            raise ValueError(f"the row tile must be >= 1, got {self.tile}")

    @property
    def padded(self) -> tuple[int, ...]:
        return tuple(-(-n // self.tile) * self.tile for n in self.lengths)

    @property
    def offsets(self) -> tuple[int, ...]:
        out, at = [], 0
        for n in self.padded:
            out.append(at)
            at += n
        return tuple(out)

    @property
    def num_rows(self) -> int:
        return sum(self.padded)

    def rows(self, b: int) -> slice:
        """Sequence b's rows in the buffer."""
        start = self.offsets[b]
        return slice(start, start + self.lengths[b])

    def pad(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """parts[b] [lengths[b], ...] (same trailing shape, dtype, device) -> one new tensor
        [num_rows, ...], zeros in the padding."""
        first = parts[0]
        out = first.new_zeros((self.num_rows, *first.shape[1:]))
        for b, part in enumerate(parts):
            out[self.rows(b)] = part
        return out

    def split(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x [num_rows, ...] -> views of each sequence's rows [lengths[b], ...]."""
        return [x[self.rows(b)] for b in range(len(self.lengths))]

    def split_all(self, xs: Sequence[torch.Tensor]) -> list[tuple[torch.Tensor, ...]]:
        """Several tensors [num_rows, ...] -> per sequence the tuple of its rows' views."""
        return list(zip(*(self.split(x) for x in xs)))


def tiled_linear(tile: int = ROW_TILE, base: Callable = F.linear) -> Callable:
    """base(x [T, K], w [N, K]) (default F.linear) computed over x's rows padded with zeros to
    a multiple of `tile` (the GEMM a sequence's rows meet in the batched forward), then cut
    back to [T, N]. No copy when T is a multiple of `tile`: then it is base itself."""
    def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        pad = -t % tile
        if pad == 0:
            return base(x, w)
        return base(torch.cat([x, x.new_zeros((pad, *x.shape[1:]))]), w)[:t]
    return linear


def linear_blocks(x: torch.Tensor, w: torch.Tensor, tile: int = ROW_TILE,
                  base: Callable = F.linear) -> torch.Tensor:
    """The slow twin of a GEMM over a tiled buffer: base (default F.linear) block by block,
    each `tile` rows of x [M, K] (M a multiple of tile) a GEMM of its own: [M, N]. Every row
    meets the same GEMM shape whatever M is, so its bits cannot depend on the batch."""
    assert x.shape[0] % tile == 0, "linear_blocks takes whole tiles"
    return torch.cat([base(x[i:i + tile], w) for i in range(0, x.shape[0], tile)])


def rows_match(op: Callable, parts: Sequence[Sequence[torch.Tensor]],
               tile: int = ROW_TILE) -> bool:
    """Whether `op` over the rows of several sequences in one tiled buffer gives each
    sequence's rows the bits `op` gives them over that sequence's own padded rows.
    parts[b]: sequence b's inputs (op's arguments, each [T_b, ...], one T_b a sequence); op
    returns one tensor [rows, ...]."""
    tiles = RowTiles(tuple(p[0].shape[0] for p in parts), tile)
    batched = op(*(tiles.pad([p[i] for p in parts]) for i in range(len(parts[0]))))
    for b, p in enumerate(parts):
        alone = RowTiles((p[0].shape[0],), tile)
        own = op(*(alone.pad([x]) for x in p))[:p[0].shape[0]]
        if not torch.equal(own, batched[tiles.rows(b)]):
            return False
    return True


def linear_rows_invariant(weights: Sequence[torch.Tensor], rows: int, num_blocks: int = 2,
                          tile: int = ROW_TILE, seed: int = 0,
                          linear: Callable = F.linear) -> bool:
    """Whether, for every weight w [N, K] given, one GEMM (`linear`, default F.linear) over
    num_blocks x `rows` rows gives each row the bits of a GEMM over its own `rows` rows (rows:
    a multiple of tile), of a GEMM over each multiple of `tile` rows below `rows`, and of
    linear_blocks over `tile` rows: the fact the batched forward relies on, checked on the
    machine at hand (inputs seeded, in w's dtype and device; the GEMM's kernel depends on the
    shapes, not the values)."""
    g = torch.Generator().manual_seed(seed)
    for w in weights:
        x = torch.randn(num_blocks * rows, w.shape[1], generator=g).to(w.device, w.dtype)
        big = linear(x, w)
        for i in range(0, x.shape[0], rows):
            if not torch.equal(linear(x[i:i + rows], w), big[i:i + rows]):
                return False
        # every padded length up to `rows` alone (a question's piece, a short sequence): a
        # GEMM's kernel may change with M at any multiple of the tile (oneDNN on AMX did)
        for m in range(tile, rows, tile):
            if not torch.equal(linear(x[:m], w), big[:m]):
                return False
        if not torch.equal(linear_blocks(x, w, tile, linear), big):
            return False
    return True


def linear_keeps_tile_bits(weights: Sequence[torch.Tensor], num_rows: int,
                           tile: int = ROW_TILE, seed: int = 0,
                           linear: Callable = F.linear) -> bool:
    """Whether, for every weight w [N, K] given, one GEMM (`linear`) over `num_rows` rows (a
    multiple of tile) gives every row the bits of linear_blocks over `tile` rows: what a batch
    whose buffer (or whose sequence alone, padded) has num_rows rows needs, checked on the
    machine at hand for that row count (inputs seeded, in w's dtype and device)."""
    assert num_rows % tile == 0, "whole tiles only"
    g = torch.Generator().manual_seed(seed)
    for w in weights:
        x = torch.randn(num_rows, w.shape[1], generator=g).to(w.device, w.dtype)
        if not torch.equal(linear(x, w), linear_blocks(x, w, tile, linear)):
            return False
    return True


def norm_keeps_rows(norm: Callable, width: int, num_rows: int, rows: int, dtype: torch.dtype,
                    device: torch.device, seed: int = 0) -> bool:
    """Whether norm(x [num_rows, width]) (a row-wise op, e.g. an RMSNorm module) gives its
    first `rows` rows the bits norm gives them alone (a copy of them): what a sequence of
    `rows` rows needs of the norms over a batch's buffer of num_rows rows (inputs seeded, in
    dtype on device; the op's kernel is taken to depend on the shapes, not the values or
    where a row lies)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_rows, width, generator=g).to(device, dtype)
    return torch.equal(norm(x)[:rows], norm(x[:rows].clone()))


def norm_rows_invariant(norm: Callable, width: int, rows: int, dtype: torch.dtype,
                        device: torch.device, counts: Sequence[int] = (2, 4, 8, 16),
                        seed: int = 0) -> bool:
    """Whether norm(x [M, width]) (a row-wise op, e.g. an RMSNorm module) gives the first
    `rows` rows of M = n x rows rows (n in counts) the bits it gives them alone: the fact a
    batch of up to max(counts) sequences of `rows` rows relies on for the norms over all
    rows (inputs seeded, in dtype on device)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(max(counts) * rows, width, generator=g).to(device, dtype)
    alone = norm(x[:rows])
    return all(torch.equal(norm(x[:n * rows])[:rows], alone) for n in counts)
