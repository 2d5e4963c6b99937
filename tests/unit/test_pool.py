"""The paged store's first parts (issue 16): page keys chained from an identity key, the same in
every process, and the block manager's bookkeeping (references, the key map, the LRU free
queue whose pages keep their keys until reused)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from block_store.memory.keys import identity_key, next_key, page_keys
from block_store.memory.pool import PagePool, PoolFull

G = 4
ROOT = identity_key({"fingerprint": "abc", "grid": G, "dtype": "bfloat16"})


def test_keys_chain_from_the_identity_and_depend_on_every_id_before():
    ids = list(range(100, 111))                        # 2 whole pages and 3 ids
    keys = page_keys(ROOT, ids, G)
    assert len(keys) == 2 and all(len(k) == 16 for k in keys)
    assert keys[0] == next_key(ROOT, ids[:4]) and keys[1] == next_key(keys[0], ids[4:8])
    assert page_keys(ROOT, ids, G, start=4, previous=keys[0]) == keys[1:]
    other = ids[:1] + [7] + ids[2:]                    # one id of the first page differs
    assert all(a != b for a, b in zip(page_keys(ROOT, other, G), keys))
    assert page_keys(identity_key({"fingerprint": "abd", "grid": G, "dtype": "bfloat16"}),
                     ids, G)[0] != keys[0]            # another model, other keys
    assert identity_key({"b": 1, "a": 2}) == identity_key({"a": 2, "b": 1})
    with pytest.raises(ValueError, match="grid line"):
        page_keys(ROOT, ids, G, start=3, previous=keys[0])
    with pytest.raises(ValueError, match="needed"):
        page_keys(ROOT, ids, G, start=4)




def test_a_freed_page_keeps_its_key_until_reused_least_recently_freed_first():
    pool = PagePool(3)
    a, b = pool.allocate(), pool.allocate()
    pool.name(a, b"ka", [1, 2, 3, 4])
    pool.name(b, b"kb", [5, 6, 7, 8])
    assert (pool.num_pinned, pool.num_cached, pool.num_free) == (2, 0, 1)
    pool.release(a)
    pool.release(b)
    assert (pool.num_pinned, pool.num_cached, pool.num_free) == (0, 2, 1)
    hit = pool.lookup(b"kb", [5, 6, 7, 8])
    assert hit is b and pool.take(hit).refs == 1 and pool.num_cached == 1
    assert pool.lookup(b"ka", [1, 2, 3, 9]) is None           # a hit compares the ids
    c = pool.allocate()                                      # the never-used page first
    d = pool.allocate()                                      # then a: freed least recently
    assert d is a and pool.lookup(b"ka", [1, 2, 3, 4]) is None and d.key is None
    with pytest.raises(PoolFull, match="all 3 pages"):
        pool.allocate()
    pool.name(c, b"kb", [5, 6, 7, 8])                        # held already by b: c stays
    assert c.key is None and pool.lookup(b"kb", [5, 6, 7, 8]) is b
    pool.release(c)
    with pytest.raises(ValueError, match="no reference"):
        pool.release(c)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "name", "take", "release"]),
                          st.integers(0, 7)), max_size=60))
def test_counts_and_the_key_map_stay_consistent(ops):
    pool, held = PagePool(5), []
    for op, n in ops:
        if op == "alloc":
            try:
                held.append(pool.allocate())
            except PoolFull:
                assert pool.num_pinned == 5
        elif op == "name" and held:
            page = held[n % len(held)]
            if page.key is None or page.key == bytes([n]):
                pool.name(page, bytes([n]), [n] * G)
            else:
                with pytest.raises(ValueError, match="another key"):
                    pool.name(page, bytes([n]), [n] * G)
        elif op == "take":
            page = pool.lookup(bytes([n]), [n] * G)
            if page is not None:
                held.append(pool.take(page))
        elif op == "release" and held:
            pool.release(held.pop(n % len(held)))
        refs = {}
        for p in held:
            refs[p.index] = refs.get(p.index, 0) + 1
        assert all(pool.pages[i].refs == r for i, r in refs.items())
        assert pool.num_pinned == len(refs) and set(pool.free).isdisjoint(refs)
        assert all(pool.pages[i].key == k for k, i in pool.by_key.items())
        assert pool.num_pinned + pool.num_cached + pool.num_free == 5
