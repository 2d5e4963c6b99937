"""One chunk of each of several sessions in one forward (Reader.read_batch, the scheduler's
batches): every session committed exactly as read alone, whatever else was in the batch."""
import random

import pytest
import torch
from helpers import check_refs, parking_reader, vocab_ids

from shadow_plugin.reader.reader import Reader
from shadow_plugin.scheduling.host import Host
from shadow_plugin.scheduling.scheduler import SchedulerConfig

G = 64


def _fed(tiny, sizes, seed=0, **kw):
    rng = random.Random(seed)
    r = Reader(tiny, grid=G, **kw)
    ids = {f"s{i}": vocab_ids(rng, n) for i, n in enumerate(sizes)}
    for s, x in ids.items():
        r.feed(s, x, "prompt")
    return r, ids


def _same_state(a, b, sid):
    x, y = a.state_tensors(sid), b.state_tensors(sid)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_a_batch_commits_each_session_as_read_alone(tiny, monkeypatch):
    sizes = [3 * G + 5, 2 * G, 5 * G + 63, G - 1, 4 * G]
    batched, ids = _fed(tiny, sizes, seed=1)
    alone, _ = _fed(tiny, sizes, seed=1)
    calls = []
    forward_batch = tiny.forward_batch
    monkeypatch.setattr(tiny, "forward_batch",
                        lambda seqs, *a, **k: calls.append(len(seqs)) or forward_batch(seqs, *a,
                                                                                       **k))
    names = list(ids)
    res = batched.read_batch(names)
    assert res.sessions == ("s0", "s1", "s2", "s4") and res.num_chunks == 4   # s3: no chunk
    assert calls == [4]
    while batched.read_batch(names).num_chunks:
        pass
    for s in names:
        alone.read(s)
        assert batched.committed(s) == alone.committed(s) == len(ids[s]) // G * G
        assert _same_state(batched, alone, s) and batched.check_exact(s)
    check_refs(batched)
    assert batched.totals["num_chunks"] == alone.totals["num_chunks"]
    # what status says of batching: forwards of several sessions' chunks, and their chunks
    assert batched.totals["num_batched_forwards"] == len(calls) >= 1
    assert batched.totals["num_batched_chunks"] == sum(calls)
    assert alone.totals["num_batched_forwards"] == alone.totals["num_batched_chunks"] == 0


def test_a_read_tells_its_final_wait_for_the_device_from_the_host_part(tiny, monkeypatch):
    """ReadResult.sync_ms: the read call's final Adapter.sync (here a device that takes 40 ms
    more); the totals keep the longest host part and the longest such wait, each within the
    longest read, for read and read_batch alike."""
    import time
    r, ids = _fed(tiny, [2 * G, 2 * G], seed=3)
    sync = r.adapter.sync
    monkeypatch.setattr(r.adapter, "sync", lambda: (time.sleep(0.04), sync()))
    one = r.read("s0", max_chunks=1)
    assert one.num_chunks == 1 and 40 <= one.sync_ms < one.ms
    both = r.read_batch(["s0", "s1"])
    assert both.num_chunks == 2 and 40 <= both.sync_ms < both.ms
    t = r.totals
    assert t["read_sync_max_ms"] == max(one.sync_ms, both.sync_ms)
    assert t["read_sync_ms"] == pytest.approx(one.sync_ms + both.sync_ms)
    assert t["read_ms"] == pytest.approx(one.ms + both.ms)
    assert t["read_host_max_ms"] == max(one.ms - one.sync_ms, both.ms - both.sync_ms) > 0
    assert t["read_max_ms"] == max(one.ms, both.ms) <= \
        t["read_host_max_ms"] + t["read_sync_max_ms"]


def test_a_read_counts_the_collections_during_it_and_the_totals_keep_the_longest_reads(
        tiny, monkeypatch):
    """ReadResult.gc_ms: the reader's gc_ms clock (GcPauses.total_ms inside vLLM) across the
    read call, for read and read_batch; the totals keep the longest read's own host part and
    collections, its time in the adapter's forward calls and its chunks
    (read_max_host_part_ms, read_max_gc_ms, read_max_forward_ms, read_max_num_chunks), and
    its thread's CPU time (read_max_cpu_ms: a sleep is off the CPU), not those of a shorter
    read after it; a reader given no clock counts none."""
    import time
    clock = [1000.0]
    r, ids = _fed(tiny, [3 * G, 2 * G], seed=4, gc_ms=lambda: clock[0])
    read_chunk, read_chunks = r.adapter.read_chunk, r.adapter.read_chunks

    def slow_chunk(*a):                               # a chunk: 2.5 ms of collections, 30 ms
        clock[0] += 2.5
        time.sleep(0.03)
        return read_chunk(*a)
    monkeypatch.setattr(r.adapter, "read_chunk", slow_chunk)
    long = r.read("s0", max_chunks=2)
    assert long.num_chunks == 2 and long.gc_ms == pytest.approx(5.0)
    # the forward calls: both sleeps, inside the read's host part
    assert 60.0 <= long.forward_ms <= long.ms - long.sync_ms
    # the thread's CPU time: the host part less the 60 ms asleep
    assert 0.0 < long.cpu_ms <= long.ms - long.sync_ms - 55.0
    monkeypatch.setattr(r.adapter, "read_chunk", read_chunk)
    monkeypatch.setattr(r.adapter, "read_chunks",
                        lambda items: (clock.__setitem__(0, clock[0] + 8.0), read_chunks(items))[1])
    both = r.read_batch(["s0", "s1"])        # shorter, with more collections: not the longest's
    assert both.num_chunks == 2 and both.gc_ms == pytest.approx(8.0) and both.ms < long.ms
    assert 0.0 < both.forward_ms <= both.ms - both.sync_ms
    t = r.totals
    assert t["read_max_ms"] == long.ms and t["read_max_gc_ms"] == pytest.approx(5.0)
    assert t["read_max_host_part_ms"] == pytest.approx(long.ms - long.sync_ms)
    assert (t["read_max_forward_ms"], t["read_max_num_chunks"]) == (long.forward_ms, 2)
    assert t["read_max_cpu_ms"] == long.cpu_ms
    assert t["read_max_num_chunks_before"] == 0              # the first read
    monkeypatch.setattr(r.adapter, "read_chunk", lambda *a: (time.sleep(0.1), read_chunk(*a))[1])
    longer = r.read("s1", max_chunks=1)                      # after the 2 + 2 chunks above
    assert longer.ms > long.ms and t["read_max_ms"] == longer.ms
    assert (t["read_max_num_chunks"], t["read_max_num_chunks_before"]) == (1, 4)
    plain, _ = _fed(tiny, [G], seed=5)
    assert plain.read("s0").gc_ms == 0.0 and plain.totals["read_max_gc_ms"] == 0.0


def test_a_shared_chunk_is_read_once_and_taken_by_the_other(tiny):
    rng = random.Random(2)
    prefix = vocab_ids(rng, 2 * G)
    r = Reader(tiny, grid=G)
    r.feed("a", prefix + vocab_ids(rng, G), "prompt")
    r.feed("b", prefix + vocab_ids(rng, G + 3), "prompt")
    first = r.read_batch(["a", "b"])
    assert first.sessions == ("a",)                  # b's chunk has a's key: next call
    second = r.read_batch(["a", "b"])
    assert second.sessions == ("a", "b")             # b took a's page without a forward
    assert r.store.counters.prefix_cache_hit_tokens["memory"] >= G
    while r.read_batch(["a", "b"]).num_chunks:
        pass
    assert r.committed("a") == r.committed("b") == 3 * G
    assert r.check_exact("a") and r.check_exact("b")
    check_refs(r)


def test_bad_batches_read_nothing(tiny):
    r, ids = _fed(tiny, [2 * G, 2 * G], seed=3)
    with pytest.raises(KeyError):
        r.read_batch(["s0", "nobody"])
    with pytest.raises(ValueError):
        r.read_batch(["s0", ""])
    assert r.committed("s0") == 0
    assert r.read_batch([]).num_chunks == 0
    assert r.read_batch(["s0", "s0"]).sessions == ("s0",)      # once each
    for bad in ("s0", None, 3):                                  # not a list of ids
        with pytest.raises(ValueError, match="a list of session ids"):
            r.read_batch(bad)


def test_sessions_parked_by_a_tight_cap_are_left_out_and_stay_exact(tiny, tmp_path):
    r = parking_reader(tiny, tmp_path)
    rng = random.Random(4)
    for s in ("a", "b", "c"):
        r.feed(s, vocab_ids(rng, 3 * G), "prompt")
    for _ in range(12):
        r.read_batch(["a", "b", "c"])
    for s in ("a", "b", "c"):
        assert r.committed(s) == 3 * G and r.check_exact(s)


def test_a_parked_session_restored_with_less_than_a_chunk_left_reads_nothing(tiny):
    """A session parked with no disk folder tells C = 0 (Reader.position: no C on disk) but
    comes back with its pages still cached (C = 512 here), its backlog under a chunk: the
    batch leaves it out rather than failing, and it stays exact."""
    rng = random.Random(5)
    r = Reader(tiny, grid=G, resident_bytes=3_000_000)
    r.feed("a", vocab_ids(rng, 8 * G + 58), "prompt")
    r.read("a")
    r.feed("b", vocab_ids(rng, 40 * G + 40), "prompt")
    r.read("b")                                   # parks a
    assert r.position("a") == (8 * G + 58, 0)
    res = r.read_batch(["a"])
    assert res.num_chunks == 0 and res.sessions == ()
    assert r.position("a") == (8 * G + 58, 8 * G) and r.check_exact("a")
    assert r.check_exact("b")
    check_refs(r)


def test_the_idle_window_reads_in_batches_and_every_state_is_exact(tiny):
    rng = random.Random(5)
    r = Reader(tiny, grid=G)
    host = Host(r, cfg=SchedulerConfig(grid=G, batch_sessions=3, idle_burst_s=60.0))
    for s, n in (("a", 4 * G + 1), ("b", 2 * G), ("c", 3 * G), ("d", G)):
        host.turn_started(s, vocab_ids(rng, n))
        host.turn_finished(s)
    out = host.idle_once()
    assert out.stop == "fresh" and dict(out.chunks) == {"a": 4, "b": 2, "c": 3, "d": 1}
    for s in ("a", "b", "c", "d"):
        assert r.backlog(s) < G and r.check_exact(s)
    assert host.num_chunks["idle"] == 10


def test_without_batched_forwards_a_call_reads_one_chunk(tiny, monkeypatch):
    """An adapter that runs batches one at a time (Adapter.batches false, so chunk_group
    takes the first alone) gets one session's chunk a call, so the host's wait stays one
    chunk."""
    r, ids = _fed(tiny, [2 * G, 3 * G, G], seed=6)
    monkeypatch.setattr(r.adapter, "batches", lambda *lengths: False)
    names = list(ids)
    got = [r.read_batch(names).sessions for _ in range(7)]
    assert got == [("s0",), ("s0",), ("s1",), ("s1",), ("s1",), ("s2",), ()]
    assert r.totals["num_batched_forwards"] == 0           # status: nothing was batched
    assert all(r.check_exact(s) for s in names)


def test_a_batch_the_adapter_reads_one_at_a_time_is_not_counted_as_batched(tiny, monkeypatch):
    """A batch whose row count the machine's GEMMs fail (EagerAdapter._keeps_bits: oneDNN on
    AMX gave other bits at 192+ rows) is read one chunk a call: status's batching
    counters say no forward was batched; a batch that ran as one forward is counted."""
    r, ids = _fed(tiny, [2 * G, 2 * G, 2 * G], seed=7)
    monkeypatch.setattr(tiny, "gemms_keep_tile_bits",
                        lambda num_rows, *a, **k: num_rows <= 2 * G)
    assert r.adapter.batches()
    # 3G rows: not batched, so one chunk a call (the reader plans with the adapter's answer)
    assert r.read_batch(list(ids)).num_chunks == 1
    assert r.totals["num_batched_forwards"] == r.totals["num_batched_chunks"] == 0
    assert r.read_batch(["s0", "s1"]).num_chunks == 2               # 2G rows: one forward
    assert (r.totals["num_batched_forwards"], r.totals["num_batched_chunks"]) == (1, 2)
    assert all(r.check_exact(s) for s in ids)


def _graph_readers(tiny):
    """Two graph-adapter readers fed the same four sessions (3, 2, 5 and 4 chunks):
    (batched, alone, ids); skipped where this CPU's GEMMs change a row's bits in a batch of
    four chunks."""
    sizes = [3 * G + 5, 2 * G, 5 * G + 63, 4 * G]
    batched, ids = _fed(tiny, sizes, seed=3, cuda_graphs=True)
    alone, _ = _fed(tiny, sizes, seed=3, cuda_graphs=True)
    if not tiny.gemms_keep_tile_bits(4 * G, G):
        pytest.skip("this CPU's GEMMs give a 64-row block other bits in a batch")
    return batched, alone, ids


def test_the_graph_adapter_reads_a_batch_in_one_forward_checked_against_alone(tiny):
    """On the graph adapter (its bodies eagerly on the CPU) a batch's chunks go through one
    chunk batch (Runners.chunk_batch), its first batch of each size checked against each
    chunk read alone, bit for bit in hidden rows and states: every session committed as
    read alone; sessions at positions of one FA4 split count (all, with SDPA) share a
    batch, three padded to the batch of four (its copy of the last writes the same rows)."""
    batched, alone, ids = _graph_readers(tiny)
    a = batched.adapter
    names = list(ids)
    while batched.read_batch(names).num_chunks:
        pass
    stats = a.graph_stats()
    # chunks due by round: 4, 4, 3 (padded to 4), 2, then s2's last alone
    assert stats["chunk_batch_bits"] == {"2": True, "4": True}
    assert stats["chunk_batches"] == [2, 4]
    assert (a.num_batched_forwards, a.num_batched_chunks) == (4, 13)
    for s in names:
        alone.read(s)
        assert batched.committed(s) == alone.committed(s) == len(ids[s]) // G * G
        assert _same_state(batched, alone, s) and batched.check_exact(s)
    check_refs(batched)


def test_a_read_batch_call_reads_what_one_forward_takes(tiny, monkeypatch):
    """Nine sessions due on the graph adapter: a call reads the eight one chunk batch takes
    (Adapter.chunk_group), the ninth the next call, one forward each."""
    rng = random.Random(0)
    r = Reader(tiny, grid=G, cuda_graphs=True)
    names = [f"s{i}" for i in range(9)]
    for s in names:
        r.feed(s, vocab_ids(rng, G + 7), "prompt")         # one chunk each
    a = r.adapter
    if not tiny.gemms_keep_tile_bits(8 * G, G):
        pytest.skip("this CPU's GEMMs give a 64-row block other bits in a batch")
    assert a.chunk_group([0] * 9) == list(range(8)) and a.chunk_group([G]) == [0]
    assert r.read_batch(names).sessions == tuple(names[:8])
    assert r.read_batch(names).sessions == (names[8],)
    assert (a.num_batched_forwards, a.num_batched_chunks) == (1, 8)


@pytest.mark.parametrize("where", ["swiglu", "norm", "gates"])
def test_a_chunk_batch_whose_bits_differ_reads_one_chunk_at_a_time(tiny, monkeypatch, where):
    """A chunk batch that starts at CHUNK_WAYS' first way (every part but FA4 in one call, as
    with row-invariant chunk ops) and whose ops over all rows give other bits: the SwiGLU
    (every way runs it over all rows, so the size is refused with a warning), the norms (the
    check takes the first way that runs them one call a chunk), the GDN gates (the first that
    runs the row-wise ops one call a chunk). Every session committed as read
    alone each time."""
    import dataclasses
    import warnings

    from adapters.runners.batch import CHUNK_WAYS
    batched, alone, ids = _graph_readers(tiny)
    a = batched.adapter
    batch = a.runners.chunk_batch(4)
    batch.use(CHUNK_WAYS[0])
    name = {"swiglu": "swiglu", "norm": "add_rms_norm", "gates": "gdn_gates"}[where]
    real = getattr(batch.ops, name)

    def off(*args):                                   # other bits over more than one chunk
        out = real(*args)
        if args[0].shape[0] <= G:
            return out
        if name == "add_rms_norm":
            return out[0], out[1] * (1 + 2 ** -6)
        if name == "gdn_gates":                       # q, k, v, g, beta: q off
            return (out[0] * (1 + 2 ** -6), *out[1:])
        return out * (1 + 2 ** -6)
    monkeypatch.setattr(batch, "ops", dataclasses.replace(batch.ops, **{name: off}))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        while batched.read_batch(list(ids)).num_chunks:
            pass
    refused = [w for w in seen if "grid chunks gave other bits" in str(w.message)]
    assert a.chunk_bits[4] is (where != "swiglu") and len(refused) == (where == "swiglu")
    assert batch.calls == {"swiglu": CHUNK_WAYS[-1], "norm": CHUNK_WAYS[2],
                           "gates": CHUNK_WAYS[3]}[where]
    way = a.graph_stats()["chunk_batch_one_call"]["4"]
    assert way == (None if where == "swiglu" else dataclasses.asdict(batch.calls))
    for s in ids:
        alone.read(s)
        assert _same_state(batched, alone, s) and batched.check_exact(s)
    check_refs(batched)


def test_chunk_batches_are_checked_only_for_the_sizes_asked(tiny):
    """check_chunk_batches checks the sizes given (none for an empty list, every batch size
    for None), and the warm-up asks for none unless told how many sessions a batch reads."""
    r = Reader(tiny, grid=G, cuda_graphs=True)
    a = r.adapter
    assert a.check_chunk_batches([]) == {} and a.runners.captures()["chunk_batches"] == []
    r.warm_up()
    assert a.chunk_bits == {} and a.runners.captures()["chunk_batches"] == []
    if not tiny.gemms_keep_tile_bits(8 * G, G):
        pytest.skip("this CPU's GEMMs give a 64-row block other bits in a batch")
    assert a.check_chunk_batches([2]) == {2: True}
    assert a.check_chunk_batches() == {2: True, 4: True, 8: True}


def test_grid_long_last_forwards_are_not_taken_for_chunks(tiny, monkeypatch):
    """Two questions whose last forwards are a whole grid of ids: no question batch takes
    them (batches is False), so advance_many runs one a step, as before chunk batches."""
    rng = random.Random(0)
    grid = 512
    r = Reader(tiny, grid=grid, cuda_graphs=True)
    a = r.adapter
    r.feed("s", vocab_ids(rng, 600), "prompt")
    r.read("s")
    items = [(vocab_ids(rng, 424), ["a", "b"]), (vocab_ids(rng, 424), ["c", "d"])]
    alone = [r.ask("s", *item).probs for item in items]
    pendings = r.begin_ask_many("s", items)
    assert [len(p.fw.rest) for p in pendings] == [grid, grid]
    assert not a.batches([grid, grid])
    steps = 0
    while r.advance_many(pendings):
        steps += 1
    assert steps >= 1
    assert [x.probs for x in r.finish_ask_many(pendings)] == alone
