"""What the batched-forward benches (evals.bi_bench, evals.question_bench) share: which row
blocks of a batch get other bits than alone."""
from __future__ import annotations

import torch


def blocks_differ(fn, inputs: list[torch.Tensor], block: int, batches) -> list[list[int]]:
    """[B, b] for each B in batches and block b < B where fn over the first B * block rows of
    inputs (each [>= max(B) * block, ...]) gives block b other bits than fn over block b's
    rows alone (fn returns a tensor or a tuple of them, all row-major in the rows)."""
    def rows(out, lo, hi):
        return [o[lo:hi] for o in (out if isinstance(out, tuple) else (out,))]
    out = []
    for b_count in batches:
        whole = fn(*[x[:b_count * block] for x in inputs])
        for b in range(b_count):
            lo, hi = b * block, (b + 1) * block
            alone = fn(*[x[lo:hi] for x in inputs])
            if not all(torch.equal(p, q) for p, q in zip(rows(whole, lo, hi),
                                                         rows(alone, 0, block))):
                out.append([b_count, b])
    return out
