"""Tilings of the table attention (attention.table): how a call's rows and keys are cut into
programs, blocks and splits, and the two the runners use: READ for chunk reads (fixed: the
committed state's bits depend on it) and DECODE for one query row (no state keeps its bits).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SplitConfig:
    """Tiling of one attention call. block_m: rows (position x group head) per program;
    block_n: keys per inner step; s_max: most splits of the keys; min_split: fewest keys a split
    holds; page_splits: splits of whole pages (their length a multiple of the page's rows, not
    of block_n), each page's place loaded once and its blocks read without the page table.
    vector_combine: the
    splits combined by (row, 64 columns) programs, every split at once (s_max a power of two;
    the sums in another order, so other bits: for decode, whose bits no state keeps; the
    combine took 0.018 ms a layer at 100k in one program a row, 128 splits in turn).
    ahead: each block's page entry loaded one block ahead (carried through the loop) rather
    than in the block's own iteration; the same blocks in the same order, so the same bits
    (not with page_splits; the probe's copy of the kernel took 0.055-0.056 ms a decode layer
    at 100k that way with 3 stages, 0.060-0.061 without, docs/decode-variants-2026-12-02.log).
    Chunk reads use READ (fixed: the committed state depends on it)."""

    block_m: int = 128       # the fastest of 7 tilings on the H200 at 8k-98k (BENCHMARKS.md)
    block_n: int = 32
    s_max: int = 16
    min_split: int = 2048
    num_warps: int = 8
    num_stages: int = 2
    page_splits: bool = False
    vector_combine: bool = False
    ahead: bool = False

    def __post_init__(self):
        pow2 = lambda x: x > 0 and x & (x - 1) == 0  # noqa: E731
        if not (pow2(self.block_m) and pow2(self.block_n) and self.block_m >= 16
                and self.block_n >= 16 and pow2(self.num_warps) and self.num_warps <= 16
                and self.num_stages >= 1 and self.s_max >= 1
                and self.min_split % self.block_n == 0 and self.min_split > 0
                and not (self.vector_combine and not pow2(self.s_max))
                and not (self.ahead and self.page_splits)):
            raise ValueError(f"{self}: block_m and block_n powers of two >= 16, num_warps a "
                             f"power of two <= 16, num_stages and s_max >= 1, min_split a "
                             f"positive multiple of block_n, s_max a power of two with "
                             f"vector_combine, ahead not with page_splits")


    @classmethod
    def parse(cls, text: str) -> "SplitConfig":
        """'BMxBNxWARPSxSTAGES' (e.g. '128x32x8x2'), the other fields default; ValueError
        naming the text when it has not four integers."""
        try:
            bm, bn, w, st = (int(x) for x in text.split("x"))
        except ValueError:
            raise ValueError(f"tiling {text!r}: expected BMxBNxWARPSxSTAGES, e.g. 128x32x8x2") \
                from None
        return cls(block_m=bm, block_n=bn, num_warps=w, num_stages=st)


READ = SplitConfig()
# one query row over paged keys: 128 splits of 32-key blocks, 4 warps, 3 stages, each block's
# page entry loaded a block ahead. In this kernel (evals/decode_probe.py at cadb457 --graph,
# split and combine, H200, docs/decode-probe-ahead-2026-12-02.log): 0.0562 ms a layer at 100k and 0.0334
# at 50k, against 0.0614 / 0.0405 with each entry loaded in its block and FlashAttention-2's
# 0.0822 / 0.0565 on contiguous rows; the same bits under two page orders, the same error
# against the fp32 twin. In the probe's copy (evals/decode_variants.py at cadb457,
# docs/decode-variants-2026-12-02.log): 1 stage 0.072, 8 warps 0.069, 64-key blocks with 8
# warps 0.058.
DECODE = SplitConfig(block_m=16, s_max=128, min_split=512, num_warps=4, num_stages=3,
                     vector_combine=True, ahead=True)
