"""The paged KV pool's memory (block_store.memory.kv_pool) and the places a runner stages for it
(adapters.runners.meta): per-layer views, the addresses the CUDA kernels take and their offsets
from the runner's base stay those of the current block when the pool grows; grown pages keep
their bits."""
import dataclasses

import pytest
import torch

from block_store import KvPool
from block_store.memory.layout import ATTENTION, GDN, StateSpec

SPEC = StateSpec((GDN, ATTENTION, GDN, ATTENTION), num_kv_heads=2, head_dim=8, conv_dim=4,
                 conv_width=4, num_value_heads=1, key_head_dim=2, value_head_dim=2,
                 dtype=torch.float16, device="cpu")


def test_views_and_addresses_follow_the_block_when_it_grows():
    pool = KvPool(SPEC, 64, 3)
    pool.block.copy_(torch.randn(pool.block.shape))
    before = pool.block.clone()
    for size in (3, 7):
        if size != pool.num_pages:
            pool.grow(size)
        assert pool.num_pages == size and pool.block.shape[2] == size
        for j in range(SPEC.num_attention):
            k, v = pool.layer(j)
            assert k.data_ptr() == pool.block[j, 0].data_ptr()
            assert v.data_ptr() == pool.block[j, 1].data_ptr()
            assert k.shape == (size, 64, 2, 8) and v.shape == k.shape
        assert pool.pointers == [x.data_ptr() for pair in pool.layers() for x in pair]
        assert torch.equal(pool.block[:, :, :3], before)


def test_staged_places_follow_the_pool_and_refuse_what_the_kernels_cannot_read():
    """runners.meta.ChunkMeta stages each layer's pools as element offsets from its base: they
    point at the pools, follow the block when it grows, and a pool off 16 bytes or of another
    dtype is refused with a ValueError before anything is staged."""
    import types

    from adapters.runners.meta import ChunkMeta
    from block_store import PagedKv
    meta = ChunkMeta(4, SPEC.num_attention, 64, torch.device("cpu"), SPEC.dtype)
    pool = KvPool(SPEC, 64, 2)
    base, size = meta.pool_base.data_ptr(), meta.pool_base.element_size()
    for grow in (False, True):
        if grow:
            pool.grow(9)
        meta.stage([1, 2, 3, 4], 60, PagedKv(pool, [1, 0]))
        for j, (k, v) in enumerate(pool.layers()):
            assert [base + x * size for x in meta.places(j).tolist()] == \
                [k.data_ptr(), v.data_ptr()]
        assert meta.pos.item() == 60 and meta.table(2).tolist() == [1, 0]
        assert meta.meta[:4].tolist() == [1, 2, 3, 4] and meta.num_pages == 2
    shifted = pool.block.view(-1)[1:]                  # 2 bytes past a pool
    odd = types.SimpleNamespace(block=shifted, pointers=[shifted.data_ptr()])
    for bad in (odd, KvPool(dataclasses.replace(SPEC, dtype=torch.float32), 64, 1)):
        with pytest.raises(ValueError, match="16-byte aligned"):
            meta.stage([1, 2, 3, 4], 0, PagedKv(bad, [0]))


def test_a_layer_off_16_bytes_is_refused_by_name():
    """Every layer's pools are checked, not only the block's start."""
    import types

    from adapters.runners.meta import ChunkMeta
    meta = ChunkMeta(4, 2, 64, torch.device("cpu"), SPEC.dtype)
    base = meta.pool_base.data_ptr()
    pool = types.SimpleNamespace(block=meta.pool_base, pointers=[base, base + 16, base + 34, 0])
    with pytest.raises(ValueError, match=f"a layer at {base + 34:#x}"):
        meta.pool_places(pool)


def test_one_pages_rows_go_where_put_pages_puts_them():
    """kv_pool.put_page (a read-ahead page's one copy) writes page p's rows as put_pages does,
    and nothing else; rows of another shape are refused, the pool unchanged."""
    from block_store.memory.kv_pool import put_page, put_pages
    one, many = KvPool(SPEC, 64, 4), KvPool(SPEC, 64, 4)
    base = torch.randn(one.block.shape).to(one.block.dtype)
    one.block.copy_(base)
    many.block.copy_(base)
    rows = torch.randn(2, *one.block.shape[:2], *one.block.shape[3:]).to(one.block.dtype)
    put_page(one, 3, rows[0])
    put_page(one, 1, rows[1])
    put_pages(many, [3, 1], rows)
    assert torch.equal(one.block, many.block) and not torch.equal(one.block, base)
    with pytest.raises(ValueError, match="shape"):
        put_page(one, 0, rows[0][:, :, :32])
    assert torch.equal(one.block, many.block)
