"""Test helpers: a sequence's KV in pages of a pool of its own, in a shuffled order among
spare pages (so the tests show bits do not depend on where pages lie); FA4's K and V pools;
chunks run through a runner and the KV rows they wrote."""
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


FA4_PAGE = 128      # rows a page in the FA4 tests: 2 sub-pages of 64 as FA4 reads them


def fa4_pools(rows, seed, d=32, device="cpu", dtype=torch.float32, spare=3):
    """K and V pools [num_pages, FA4_PAGE, 2, d] holding `rows` rows (values from `seed`) in an
    order and among spare pages of noise that depend on `spare`: (k_pool, v_pool, pages,
    k_rows [rows, 2, d], v_rows)."""
    g = torch.Generator(device=device).manual_seed(seed)
    n = -(-rows // FA4_PAGE)
    k_rows, v_rows = (torch.randn(n, FA4_PAGE, 2, d, device=device, generator=g).to(dtype)
                      for _ in "kv")
    pages = torch.randperm(n + spare, generator=torch.Generator().manual_seed(spare))[:n]
    pools = []
    for x in (k_rows, v_rows):
        pool = torch.randn(n + spare, FA4_PAGE, 2, d, device=device).to(dtype)
        pool[pages.to(device)] = x
        pools.append(pool)
    return (pools[0], pools[1], pages.tolist(), k_rows.flatten(0, 1)[:rows],
            v_rows.flatten(0, 1)[:rows])


def run_chunks(model, runner, kv, ids, t):
    """ids through `runner` t at a time from zero GDN states: ([hidden of each chunk], the GDN
    states at the end)."""
    from adapters import spec_for
    from block_store.memory.layout import zero_gdn
    gdn = zero_gdn(spec_for(model.cfg, model.device, model.dtype))
    hidden = []
    for pos in range(0, len(ids), t):
        h, gdn = runner.run(ids[pos:pos + t], pos, kv, gdn)
        hidden.append(h)
    return hidden, gdn


def kv_rows(kv, rows):
    """Every attention layer's K and V rows [0, rows) in row order."""
    out = []
    for k, v in kv.pool.layers():
        for x in (k, v):
            out.append(x[kv.pages].flatten(0, 1)[:rows])
    return out
