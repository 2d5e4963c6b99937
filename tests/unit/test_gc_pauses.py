"""GcPauses: the process's garbage collections timed through gc.callbacks."""
import gc
import threading

import pytest

from shadow_plugin.engine.gc_pauses import GcPauses


def test_times_a_full_collection_and_stops_when_removed():
    pauses = GcPauses().install().install()          # idempotent: one callback
    try:
        assert gc.callbacks.count(pauses._on_gc) == 1
        junk = [[i] for i in range(200_000)]          # something for the collection to walk
        gc.collect()
        del junk
        stats = pauses.stats()
        assert stats["num_gc_pauses"] >= 1
        assert stats["gc_pause_max_generation"] in (0, 1, 2)
        assert 0 < stats["gc_pause_max_ms"] <= stats["gc_pauses_ms"]
    finally:
        pauses.remove()
    assert pauses._on_gc not in gc.callbacks
    before = pauses.stats()
    gc.collect()
    assert pauses.stats() == before                   # removed: nothing more timed
    pauses.remove()                                   # idempotent


def test_a_full_collection_is_the_longest_when_it_is_the_only_one():
    gc.disable()                                      # no automatic collection meanwhile
    pauses = GcPauses().install()
    try:
        gc.collect(2)
        assert pauses.stats()["num_gc_pauses"] == 1
        assert pauses.stats()["gc_pause_max_generation"] == 2
    finally:
        pauses.remove()
        gc.enable()


def test_freeze_heap_freezes_what_lives_and_times_its_young_collection():
    gc.disable()                                      # no automatic collection meanwhile
    pauses = GcPauses().install()
    try:
        kept = [[i] for i in range(50_000)]           # alive: frozen with the rest
        before = gc.get_freeze_count()
        frozen = pauses.freeze_heap()
        assert frozen == gc.get_freeze_count() - before > len(kept)
        assert pauses.frozen_objects == frozen == pauses.stats()["gc_frozen_objects"]
        stats = pauses.stats()                        # its young collection: the start's
        assert stats["num_gc_startup_pauses"] == 1 and stats["gc_startup_pause_max_ms"] > 0
        assert stats["gc_startup_pauses_ms"] == stats["gc_startup_pause_max_ms"]
        assert stats["num_gc_pauses"] == 0 and stats["gc_pauses_ms"] == 0.0   # serving: none
        assert stats["gc_pause_max_generation"] == -1 and stats["gc_pause_max_thread"] == ""
        total = pauses.total_ms
        assert total == stats["gc_startup_pauses_ms"]
        gc.collect()
        stats = pauses.stats()                        # serving's first
        assert stats["num_gc_pauses"] == 1 and stats["gc_pause_max_generation"] == 2
        assert stats["gc_pause_max_thread"] == threading.current_thread().name
        assert stats["num_gc_startup_pauses"] == 1    # the start's stay
        assert pauses.total_ms == pytest.approx(total + stats["gc_pauses_ms"])
    finally:
        pauses.remove()
        gc.unfreeze()
        gc.enable()
    assert gc.get_freeze_count() == 0


def test_a_collection_set_off_in_another_thread_is_named_and_counted_in_the_total():
    gc.disable()                                      # no automatic collection meanwhile
    pauses = GcPauses().install()
    try:
        t = threading.Thread(target=gc.collect, name="shadow-idle")
        t.start()
        t.join()
        stats = pauses.stats()
        assert stats["num_gc_pauses"] == 1 and stats["gc_pause_max_thread"] == "shadow-idle"
        assert pauses.total_ms == stats["gc_pauses_ms"] == stats["gc_pause_max_ms"] > 0
    finally:
        pauses.remove()
        gc.enable()
