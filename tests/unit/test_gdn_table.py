"""The GDN table's byte counts, kept as entries and references come and go, against a recount
of the entries (their slow twin), under random puts, releases, evictions and drops."""
import random

import pytest
import torch

from block_store.memory.gdn_table import GdnTable


def _states(n_layers: int, width: int):
    return [(torch.zeros(4, width, dtype=torch.bfloat16), torch.zeros(2, width, width))
            for _ in range(n_layers)]


def _recount(table: GdnTable) -> tuple[int, int]:
    every = sum(sum(c.nbytes + r.nbytes for c, r in e.states) for e in table.entries.values())
    loose = sum(sum(c.nbytes + r.nbytes for c, r in e.states)
                for e in table.entries.values() if e.refs == 0)
    return every, loose


def test_byte_counts_follow_every_change():
    rng = random.Random(0)
    table = GdnTable(budget_bytes=3000)
    evicted = []
    table.on_evict = evicted.append
    held = []                                     # one item per reference taken
    for step in range(600):
        op = rng.random()
        if op < 0.45:
            key = bytes([rng.randrange(12)])
            held.append(table.put(key, 512 * key[0], _states(rng.randrange(1, 3),
                                                                rng.choice((2, 4))),
                                  owned=rng.random() < 0.5))
        elif op < 0.8 and held:
            table.release(held.pop(rng.randrange(len(held))))
        elif op < 0.9:
            table.evict(rng.choice((None, 0, 1000)))
        else:
            loose = [e for e in table.entries.values() if e.refs == 0]
            if loose:
                table.drop(rng.choice(loose))
        assert (table.nbytes, table.loose_bytes) == _recount(table), step
    assert evicted and all(e.key not in table.entries or table.entries[e.key] is not e
                           for e in evicted)


def test_evict_keeps_referenced_entries_and_meets_the_budget():
    table = GdnTable(budget_bytes=0)
    kept = table.put(b"a", 512, _states(1, 4))
    table.put(b"b", 1024, _states(1, 4))
    table.release(table.get(b"b"))
    freed = table.evict()
    assert freed == kept.nbytes and list(table.entries) == [b"a"]
    assert table.loose_bytes == 0 and table.nbytes == kept.nbytes


def test_drop_refuses_a_referenced_entry_and_keeps_it():
    table = GdnTable(budget_bytes=10**9)
    e = table.put(b"a", 512, _states(1, 2))
    with pytest.raises(ValueError, match="unreferenced"):
        table.drop(e)
    assert table.get(b"a") is e and table.nbytes == e.nbytes


def test_an_entry_given_up_unused_goes_at_once_unless_held_or_earned():
    """GdnTable.give_up (issue 33): a tip or checkpoint its session gives up goes at once when
    no one else holds it (a tip marked not worth writing, unless it served a resume: then the
    disk tier writes it); one another session holds and a junction stay."""
    table = GdnTable(budget_bytes=10**9)
    seen = []
    table.on_evict = lambda e: seen.append((e.key, e.spill))
    tip = table.put(b"t", 512, _states(1, 2), kind="tip")
    table.give_up(tip)
    assert b"t" not in table.entries and seen == [(b"t", False)] and table.nbytes == 0
    cp = table.put(b"c", 512, _states(1, 2), kind="checkpoint")
    table.give_up(cp)
    assert seen[-1] == (b"c", True) and table.evicted_by_kind == {
        "checkpoint": 1, "shared": 0, "tip": 1, "junction": 0, "state": 0}
    shared = table.put(b"s", 1024, _states(1, 2), kind="tip")
    table.put(b"s", 1024, _states(1, 2))                    # another session holds it too
    table.give_up(shared)
    assert shared.refs == 1 and table.get(b"s") is shared
    earned = table.put(b"e", 1536, _states(1, 2), kind="tip")
    earned.hits += 1                                         # a prompt resumed from it
    table.give_up(earned)
    assert b"e" not in table.entries and seen[-1] == (b"e", False) and earned.hits == 1
    junction = table.put(b"j", 2048, _states(1, 2), kind="junction")
    table.give_up(junction)
    assert table.get(b"j") is junction and table.num_evicted == 3 and table.loose_bytes == \
        junction.nbytes
