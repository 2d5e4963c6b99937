"""Pages shared between sessions (issue 16): KV in pages keyed by chained prefix hashes, GDN
states in a parallel table, one lookup for rollback and sharing. After any history of many
sessions that share prefixes and diverge, with rewrites, asks, evictions of GDN entries,
spills and restores, every session's committed state equals a fresh prefill bit for bit, and
every page's references are exactly the sessions holding it."""
import dataclasses
import random

import pytest
from helpers import check_refs, rand_ids  # noqa: E402
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadow_plugin.reader.reader import Reader

G = 64


op = st.one_of(
    st.tuples(st.just("new"), st.integers(0, 4), st.integers(0, 150)),   # prefix k, tail
    st.tuples(st.just("rewrite"), st.integers(0, 3), st.integers(0, 200), st.integers(1, 90)),
    st.tuples(st.just("append"), st.integers(0, 3), st.integers(1, 150)),
    st.tuples(st.just("read"), st.integers(0, 3)),
    st.tuples(st.just("ask"), st.integers(0, 3)),
    st.tuples(st.just("evict_gdn")),
    st.tuples(st.just("park"), st.integers(0, 3)),
    st.tuples(st.just("evict_pages")),
    st.tuples(st.just("restart")),
    st.tuples(st.just("drop"), st.integers(0, 3)),
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(op, min_size=3, max_size=10), seed=st.integers(0, 2**32 - 1),
       disk=st.booleans(), small=st.booleans())
def test_sessions_sharing_prefixes_stay_exact(tiny, tmp_path_factory, ops, seed, disk, small):
    """`small`: a resident cap of about 9 pages of random:tiny, so sessions park, loose GDN
    entries are evicted and cached pages reused by themselves (with a disk, written first);
    `drop` deletes a session (its pages cached, its entries loose, nothing written)."""
    rng = random.Random(seed)
    disk_dir = tmp_path_factory.mktemp("d") if disk else None
    cap = {"resident_bytes": 600_000} if small else {}
    reader = Reader(tiny, grid=G, max_checkpoints=2, disk_dir=disk_dir, **cap)
    prefix = rand_ids(5 * G, rng)
    cuts = [0, G - 1, G, G + 1, 2 * G + 30]                   # k G, k G - 1, k G + 1
    names, made = [], 0
    for o in [("new", 3, 40), ("read", 0)] + ops:
        if o[0] == "new":
            sid, made = f"s{made}", made + 1
            names.append(sid)
            reader.feed(sid, prefix[:cuts[o[1]]] + rand_ids(o[2] + 1, rng), "prompt")
        elif not names:
            continue
        else:
            sid = names[o[1] % len(names)] if len(o) > 1 else None
        if o[0] == "rewrite":
            held = reader.ids(sid)
            d = min(o[2], len(held))
            reader.feed(sid, held[:d] + rand_ids(o[3], rng), "prompt")
        elif o[0] == "append":
            reader.feed(sid, reader.ids(sid) + rand_ids(o[2], rng), "prompt")
        elif o[0] == "read":
            reader.read(sid)
        elif o[0] == "ask":
            n = len(reader.ids(sid))
            a = reader.ask(sid, [5, 6, 7], ["a", "b"], at=rng.randrange(1, n + 1))
            fresh = Reader(tiny, grid=G)
            fresh.feed("f", reader.ids(sid)[:a.at], "prompt")
            assert fresh.ask("f", [5, 6, 7], ["a", "b"], at=a.at).probs == a.probs
        elif o[0] == "evict_gdn":
            reader.table.store.gdn.evict(0)
        elif o[0] == "park":
            if sid in reader.table.resident:
                reader.table.park(sid)
        elif o[0] == "evict_pages":
            reader.table.store.manager.forget_cached()
        elif o[0] == "restart" and disk:     # a planned stop, then a new reader on the folder
            held = {s: reader.ids(s) for s in names}
            reader.close()
            reader = Reader(tiny, grid=G, max_checkpoints=2, disk_dir=disk_dir, **cap)
            assert {s: reader.ids(s) for s in names} == held
        elif o[0] == "drop":
            reader.drop(sid)
            names.remove(sid)
        check_refs(reader)
        for s in names:
            assert reader.check_exact(s)
        check_refs(reader)


def _reader(tiny, **kw):
    return Reader(tiny, grid=G, **{"max_checkpoints": 2, **kw})


def test_a_shared_prefix_is_read_once_and_held_once(tiny):
    """Three sessions of one agent: the second and third resume at the prefix's last whole
    page (the state kept at the tip of the first's read), read only their own ids, and
    reference the same pages; resident bytes count those pages once."""
    rng = random.Random(1)
    prefix = rand_ids(4 * G + 10, rng)
    r = _reader(tiny)
    r.feed("a", prefix, "prompt")
    r.read("a")
    read_before = r.stats()["read_tokens"]
    for s in "bc":
        r.feed(s, prefix + rand_ids(100, rng), "prompt")
        assert r.committed(s) == 4 * G                     # resumed, nothing read
        r.read(s)
    stats = r.stats()
    assert stats["read_tokens"] - read_before == 2 * G     # one own page each
    pages = {s: [p.index for p in r.table.resident[s].pages] for s in "abc"}
    assert pages["a"] == pages["b"][:4] == pages["c"][:4]
    assert stats["pages"]["pinned"] == 4 + 2
    assert stats["prefix_cache_hit_tokens"]["memory"] >= 2 * 4 * G
    kinds = stats["gdn_entries_by_kind"]       # a's prompt-line checkpoint served b and c
    assert kinds["checkpoint"]["hits"] == 2 and sum(k["hits"] for k in kinds.values()) == 2
    assert all(r.check_exact(s) for s in "abc")
    for s in "abc":                            # the entries go; what they earned stays counted
        r.drop(s)
    r.table.store.gdn.evict(0)
    stats = r.stats()
    assert stats["gdn_entries"]["resident"] == 0 and stats["gdn_entries_by_kind"] == {}
    assert stats["gdn_entry_hits"] == {"checkpoint": 2, "shared": 0, "tip": 0, "junction": 0,
                                       "state": 0}


def test_a_gdn_entry_evicted_while_its_pages_stay_resumes_at_the_deepest_line_with_both(tiny):
    """vLLM #43090's class: pages without the state at their end are never resumed from; the
    lookup falls back to the deepest line where both exist."""
    rng = random.Random(2)
    ids = rand_ids(6 * G, rng)
    r = _reader(tiny)
    r.feed("a", ids[:3 * G] + [1], "prompt")               # checkpoint at 3G (prompt line)
    r.read("a")
    r.feed("a", ids, "prompt")
    r.read("a")                                            # tip entries at 3G to 6G
    store = r.table.store
    r.table.park("a")          # its entries unreferenced
    tip = [e for e in store.gdn.entries.values() if e.line > 3 * G]
    for e in tip:
        store.gdn.drop(e)                                  # the tip's states are gone
    r.feed("b", ids + [9], "prompt")
    assert r.committed("b") == 3 * G                       # not 6G: no state there
    r.read("b")
    assert r.check_exact("b")


def test_pages_held_without_state_are_not_reused(tiny):
    """LMCache #2845's class: with every GDN entry gone, held pages give no resume point."""
    rng = random.Random(3)
    ids = rand_ids(4 * G, rng)
    r = _reader(tiny)
    r.feed("a", ids, "prompt")
    r.read("a")
    r.table.park("a")
    r.table.store.gdn.evict(0)
    assert r.stats()["pages"]["cached"] == 4
    r.feed("b", ids + [5], "prompt")
    assert r.committed("b") == 0
    r.read("b")
    assert r.check_exact("b") and r.stats()["pages"]["pinned"] == 4   # the same pages again


def test_two_sessions_sharing_one_and_a_half_pages_let_a_third_reuse_a_page(tiny):
    """vLLM #45238's case: a and b share 1.5 pages then differ; c, with the same prefix,
    resumes at least one page in (the junction's state: b's rewrite kept it)."""
    rng = random.Random(4)
    common = rand_ids(G + G // 2, rng)
    r = _reader(tiny)
    r.feed("a", common + rand_ids(3 * G, rng), "prompt")
    r.read("a")
    r.feed("b", common + rand_ids(3 * G, rng), "prompt")
    r.read("b")
    r.feed("c", common + rand_ids(2 * G, rng), "prompt")
    assert r.committed("c") >= G
    r.read("c")
    assert all(r.check_exact(s) for s in "abc")


@pytest.mark.parametrize("n", [2 * G, 2 * G - 1, 2 * G + 1])
def test_prompts_on_and_off_the_grid_spill_restore_and_continue(tiny, tmp_path, n):
    """vLLM #51094's class: prompts of k G, k G - 1 and k G + 1 ids spilled, restored (in
    this process and in a new reader on the same folder) and continued stay exact."""
    rng = random.Random(n)
    ids = rand_ids(n, rng)
    r = _reader(tiny, disk_dir=tmp_path)
    r.feed("a", ids, "prompt")
    r.read("a")
    r.table.park("a")
    r.feed("a", ids + [7] * 70, "prompt")
    r.read("a")
    assert r.committed("a") == (n + 70) // G * G and r.check_exact("a")
    r.close()
    r2 = _reader(tiny, disk_dir=tmp_path)
    r2.feed("a", ids + [7] * 70 + [8] * 60, "prompt")
    assert r2.committed("a") >= (n + 70) // G * G - G      # restored from its file
    r2.read("a")
    assert r2.check_exact("a")


def test_a_chunk_held_with_its_end_state_is_taken_without_a_forward(tiny):
    """Ids that complete a chunk another session already read (its page and the state at its
    end held) are committed without a forward. An identical second session, fed turn by turn:
    resumes at a's prompt-line checkpoint (G), then takes [G, 5G) held (a's tip ring at 2G to
    5G: the last four lines a committed), reads nothing, and is exact."""
    rng = random.Random(6)
    ids = rand_ids(5 * G, rng)
    r = _reader(tiny)
    for s in "ab":
        r.feed(s, ids[:100], "prompt")
        r.read(s)
        r.feed(s, ids[100:], "output")
        r.read(s)
    stats = r.stats()
    assert stats["read_tokens"] == 5 * G                         # a's only
    assert r.committed("b") == 5 * G and stats["pages"]["pinned"] == 5   # held once
    assert stats["prefix_cache_hit_tokens"]["memory"] == G + 4 * G      # resumed + taken
    assert stats["gdn_entries_by_kind"]["tip"]["hits"] == 4
    assert (stats["gdn_entry_hits"]["tip"], stats["gdn_entry_hits"]["checkpoint"]) == (4, 1)
    assert r.check_exact("a") and r.check_exact("b")
    check_refs(r)


def _failing(r, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("the adapter failed")
    monkeypatch.setattr(r.adapter, "read_chunk", boom)


def test_a_failed_fork_read_gives_its_base_back_and_leaves_none_behind(tiny, monkeypatch):
    """A re-read below C that raises (in prepare_fork or in an ask) gives the base's pages
    back and leaves no base a later ask could use; that ask equals a fresh reader's."""
    rng = random.Random(7)
    ids = rand_ids(9 * G + 10, rng)                       # the tip ring at 6G to 9G
    r = _reader(tiny, max_checkpoints=4)
    r.feed("a", ids[:2 * G + 5], "prompt")                 # a checkpoint at 2G
    r.read("a")
    r.feed("a", ids, "prompt")
    r.read("a")
    at = 3 * G + 5
    while r.prepare_fork("a", at=at, max_chunks=8):
        pass
    with monkeypatch.context() as m:
        _failing(r, m)
        for call in (lambda: r.prepare_fork("a", at=5 * G + 5, max_chunks=8),
                     lambda: r.ask("a", [5, 6, 7], ["x", "y"], at=4 * G + 5)):
            with pytest.raises(RuntimeError, match="adapter failed"):
                call()
            check_refs(r)
    assert "a" not in r._scratch
    fresh = _reader(tiny)
    fresh.feed("f", ids[:at], "prompt")
    assert r.ask("a", [5, 6, 7], ["x", "y"], at=at).probs == \
        fresh.ask("f", [5, 6, 7], ["x", "y"], at=at).probs
    r.drop("a")
    assert r.stats()["pages"]["pinned"] == 0


def test_the_cap_drops_unreferenced_gdn_entries_before_parking_a_session(tiny):
    rng = random.Random(8)
    r = _reader(tiny, resident_bytes=1 << 40)
    for s in "ab":
        r.feed(s, rand_ids(4 * G + 5, rng), "prompt")
        r.read(s)
    r.drop("b")                                            # its entries stay, unreferenced
    r.feed("c", rand_ids(G + 5, rng), "prompt")
    r.read("c")
    res, gdn = r.table.residency, r.table.store.gdn
    loose = gdn.loose_bytes
    assert loose > 0
    res.cfg = dataclasses.replace(res.cfg, resident_bytes=res.resident_bytes(r.table.resident)
                                  - 1000)
    r.table.settle("c")
    assert sorted(r.table.resident) == ["a", "c"] and 0 <= gdn.loose_bytes < loose


def test_a_session_whose_file_cannot_be_written_is_dropped_with_its_ids(tiny, tmp_path,
                                                                        monkeypatch):
    from block_store.disk import store as disk
    r = _reader(tiny, disk_dir=tmp_path)
    ids = rand_ids(3 * G + 5, random.Random(9))
    r.feed("a", ids, "prompt")
    r.read("a")

    def full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(disk, "atomic_save", full)
    r.table.park("a")
    check_refs(r)
    assert r.knows("a") and r.stats()["write_errors"] == 1 and r.stats()["pages"]["pinned"] == 0
    monkeypatch.undo()
    r.feed("a", ids + [5], "prompt")                       # found again by its keys
    assert r.committed("a") == 3 * G and r.check_exact("a")


def test_blank_pages_are_reused_before_a_cached_prefix_and_a_chain_keeps_its_head(tiny):
    """Scratch pages freed by a fork go to the front of the free queue, and a session's pages
    are freed last page first: a later session with the dropped session's prefix finds it."""
    rng = random.Random(10)
    prefix = rand_ids(3 * G + 5, rng)
    r = _reader(tiny)
    r.feed("a", prefix, "prompt")
    r.read("a")
    r.drop("a")
    r.feed("b", [11], "prompt")
    r.ask("b", [5] * 150, ["x", "y"])                      # scratch pages, given back blank
    r.feed("b", rand_ids(3 * G + 3, rng), "prompt")
    r.read("b")
    r.feed("c", prefix + [9], "prompt")
    assert r.committed("c") == 3 * G and r.check_exact("c")


def test_the_gdn_budget_is_the_readers_to_set(tiny):
    """Reader(gdn_bytes=0): unreferenced entries go at once (a dropped session's state is not
    kept); a negative budget is refused."""
    rng = random.Random(11)
    ids = rand_ids(3 * G + 5, rng)
    r = _reader(tiny, gdn_bytes=0)
    r.feed("a", ids, "prompt")
    r.read("a")
    r.drop("a")
    r.feed("b", [1], "prompt")                           # settles: the loose entries go
    assert r.table.store.gdn.loose_bytes == 0
    r.feed("c", ids + [5], "prompt")
    assert r.committed("c") == 0                         # pages cached, no state: from 0
    with pytest.raises(ValueError, match="gdn_bytes must be >= 0"):
        _reader(tiny, gdn_bytes=-1)


def test_turn_starts_are_counted_fresh_or_behind_under_the_metrics_names(tiny):
    """A prompt begins a turn: fresh when its session had less than a chunk unread as it
    began, behind otherwise (`shadow_turn_starts_total{fresh=...}` without the prefix);
    outputs and a refused prompt begin none."""
    r = Reader(tiny, grid=G)
    assert r.stats()["turn_starts"] == {"true": 0, "false": 0}
    ids = list(range(1000, 1000 + 2 * G + 5))
    r.feed("s", ids, "prompt")                    # a new session: nothing unread before it
    r.feed("s", ids + [7, 8], "prompt")           # 2G + 5 unread as it began: behind
    r.feed("s", [9], "output")
    r.read("s")
    r.feed("s", ids + [7, 8, 9, 10], "prompt")    # 11 unread: fresh
    with pytest.raises(ValueError):
        r.feed("s", [], "prompt")
    assert r.stats()["turn_starts"] == {"true": 2, "false": 1}
