"""Test helper: a sequence's KV in pages of a pool of its own, in a shuffled order among
spare pages (so the tests show bits do not depend on where pages lie)."""
import random

import torch

from block_store import KvPool, PagedKv


def paged_kv(spec, page_rows: int, rows: int, seed: int = 0, spare: int = 3) -> PagedKv:
    """Room for `rows` rows in ceil(rows / page_rows) pages picked at random among that many
    plus `spare` (filled with noise, which no read may see)."""
    n = -(-rows // page_rows)
    pool = KvPool(spec, page_rows, n + spare)
    pool.block.copy_(torch.randn(pool.block.shape, generator=torch.Generator().manual_seed(seed)))
    order = list(range(n + spare))
    random.Random(seed).shuffle(order)
    for _ in range(n):
        pool.manager.allocate()
    return PagedKv(pool, order[:n])
