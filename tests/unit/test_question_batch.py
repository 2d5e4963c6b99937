"""runners.batch.BatchRunner on the CPU (its body eagerly, SDPA through each fork's
pages): B forks of one session at one position, each with pages and states of its own, get
from one forward the hidden rows and KV rows their own runner gives them, bit for bit; bad
batches are refused before anything runs."""
import pytest
import torch
from paged import paged_kv

from adapters import state_spec
from adapters.runners.batch import BatchRunner
from adapters.runners.runners import Runners
from block_store import PagedKv

G = 64


def _forks(tiny, num_forks: int, pos: int, seed: int, page_rows: int = G):
    """num_forks forks at pos (a page boundary) over one pool: the rows below pos shared (the
    session's pages), a page of its own each for rows [pos, pos + G), states of their own."""
    spec = state_spec(tiny)
    base = paged_kv(spec, page_rows, pos + num_forks * page_rows, seed=seed)
    shared = base.pages[:pos // page_rows]
    g = torch.Generator().manual_seed(seed)
    forks = []
    for b in range(num_forks):
        kv = PagedKv(base.pool, shared + [base.pages[pos // page_rows + b]])
        gdn = [(torch.randn(spec.conv_dim, spec.conv_width, generator=g).to(tiny.dtype),
                torch.randn(*spec.recurrent_shape, generator=g) * 0.1)
               for _ in range(spec.num_gdn)]
        ids = torch.randint(0, tiny.cfg.vocab_size, (G,), generator=g).tolist()
        forks.append((ids, pos, kv, gdn))
    return forks


def _rows(kv: PagedKv, pos: int):
    """The page holding row pos, of every attention layer's k and v pools, copied."""
    out = []
    for j in range(len(kv.pool.pointers) // 2):
        k, v = kv.pool.layer(j)
        page = kv.pages[pos // kv.page_rows]
        out += [k[page].clone(), v[page].clone()]
    return out


@pytest.mark.parametrize("grid,num_forks,pos", [(G, 2, 0), (G, 4, 3 * G), (2 * G, 8, 4 * G),
                                                (2 * G, 4, 2 * G)])
def test_each_fork_gets_its_own_runners_bits(tiny, grid, num_forks, pos):
    """Grid 64: the bucket's runner is the chunk runner; grid 128: a question runner of
    its own (no states returned), as on a reader's grid of 512."""
    runners = Runners(tiny, grid)
    batch = runners.question_batch(G - 5, num_forks)
    assert isinstance(batch, BatchRunner) and batch.t == G and batch.num_seqs == num_forks
    assert (runners.for_rows(G) is runners.chunk) == (grid == G)
    forks = _forks(tiny, num_forks, pos, seed=num_forks, page_rows=grid)
    if not tiny.gemms_keep_tile_bits(num_forks * G, G):
        pytest.skip("this CPU's GEMMs give a 64-row block other bits in a batch")
    states = [[(c.clone(), r.clone()) for c, r in gdn] for *_, gdn in forks]
    hidden = batch.run(forks)
    written = [_rows(kv, pos) for _, _, kv, _ in forks]
    for (ids, p, kv, gdn), h, rows, kept in zip(forks, hidden, written, states):
        assert all(torch.equal(a, b) for (a, b), (c, d) in zip(gdn, kept)
                   for a, b in ((a, c), (b, d)))      # the forks' states not changed
        alone, _ = runners.for_rows(G).run(ids, p, kv, gdn)
        assert h.shape == (G, tiny.cfg.hidden_size) and torch.equal(h, alone)
        assert all(torch.equal(x, y) for x, y in zip(rows, _rows(kv, p)))


def test_bad_batches_are_refused_before_anything_runs(tiny):
    runners = Runners(tiny, G)
    batch = runners.question_batch(10, 2)
    forks = _forks(tiny, 3, 2 * G, seed=1)
    before = batch.hidden.clone()
    with pytest.raises(ValueError, match="a batch of 2 forks, got 3"):
        batch.run(forks)
    other = forks[1][:1] + (3 * G,) + forks[1][2:]
    with pytest.raises(ValueError, match="at one position"):
        batch.run([forks[0], other])
    with pytest.raises(ValueError, match="64 ids each"):
        batch.run([forks[0], (forks[1][0][:5],) + forks[1][1:]])
    short = (forks[1][0], 2 * G, PagedKv(forks[1][2].pool, forks[1][2].pages[:2]), forks[1][3])
    with pytest.raises(ValueError, match="cannot take rows 128 to 192"):
        batch.run([forks[0], short])
    assert torch.equal(batch.hidden, before)
    with pytest.raises(ValueError, match="2 or more forks"):
        BatchRunner(runners.for_rows(G), runners.batch_slots(1))
    assert runners.question_batch(G, 1) is None and runners.question_batch(300, 2) is None
    assert runners.question_batch(G, 9) is None            # past the largest batch size
    assert runners.question_batch(G, 3).num_seqs == 4      # 3 forks: the batch of 4
    assert runners.captures()["question_batches"] == ["2x64", "4x64"]
    assert runners.batch_slots(4)[:2] == batch.slots       # one set of slots for all


@pytest.mark.parametrize("rows", [True, False])
def test_the_recurrences_heads_and_gates_in_one_call_or_one_a_fork_give_the_same_rows(
        tiny, monkeypatch, rows):
    """BatchRunner.calls.recurrences: the forks' GDN recurrences through
    KernelSet.recurrences, one call of gdn_many over [B, t] rows (counted here); with
    calls.conv also the conv in one call of conv_many (counted), and with calls.rows the gates
    and the q/k heads over all rows; against one call a fork
    (batch.PER_FORK): the same hidden rows, each equal to its runner's alone.
    Without FA4 the attention runs one call a fork whatever OneCall says."""
    import dataclasses

    from adapters.model import kernels
    from adapters.runners.batch import PER_FORK, OneCall
    runners = Runners(tiny, G)
    calls, convs = [], []

    def gdn_many(*args):
        calls.append(args[0].shape)
        return kernels.gdn_each(tiny.kernels.gdn, *args)

    def conv_many(x, weight, state):
        convs.append(tuple(x.shape))
        return kernels.conv_each(tiny.kernels.conv, x, weight, state)
    monkeypatch.setattr(tiny, "kernels", dataclasses.replace(
        tiny.kernels, gdn_many=gdn_many, conv_many=conv_many))
    forks = _forks(tiny, 4, 2 * G, seed=11)
    one_call = BatchRunner(runners.for_rows(G), runners.batch_slots(4),
                             OneCall(conv=rows, rows=rows))
    per_fork = BatchRunner(runners.for_rows(G), runners.batch_slots(4), PER_FORK)
    assert one_call.calls == OneCall(attention=False, conv=rows,   # SDPA: per fork
                                     rows=rows)
    assert per_fork.calls == PER_FORK
    if not tiny.gemms_keep_tile_bits(4 * G, G):
        pytest.skip("this CPU's GEMMs give a 64-row block other bits in a batch")
    out = one_call.run(forks)
    num_gdn = len(tiny.cfg.linear_layers)
    assert calls == [(4, G, tiny.cfg.linear_num_key_heads, tiny.cfg.linear_key_head_dim)] \
        * num_gdn
    assert convs == [(4, G, tiny.cfg.conv_dim)] * num_gdn * rows
    assert all(torch.equal(a, b) for a, b in zip(out, per_fork.run(forks)))
    assert len(calls) == num_gdn and len(convs) == num_gdn * rows     # none one a fork
    for (ids, p, kv, gdn), h in zip(forks, out):
        assert torch.equal(h, runners.for_rows(G).run(ids, p, kv, gdn)[0])


def test_one_call_falls_back_from_all_in_one_to_per_fork():
    """The ways in order (batch.WAYS): the norms one call a fork first, then the row-wise
    ops, then the conv, then FA4, then the recurrences; without FA4 the ways with FA4 in one
    call are skipped; a way not among WAYS falls to the first with fewer parts."""
    from adapters.runners.batch import ALL_IN_ONE, CHUNKS, PER_FORK, WAYS, OneCall
    ways = [ALL_IN_ONE]
    while ways[-1].fallback() is not None:
        ways.append(ways[-1].fallback())
    assert ways == list(WAYS) and ways[-1] == PER_FORK and len(set(ways)) == 9
    assert [w.name for w in ways] == [
        "attention+recurrences+conv+rows+norms", "attention+recurrences+conv+rows",
        "attention+recurrences+conv+norms",
        "attention+recurrences+norms", "recurrences+conv+rows+norms", "recurrences+conv+norms",
        "recurrences+norms", "attention+norms", "per_fork"]
    cpu = OneCall(attention=False)
    assert ALL_IN_ONE.fallback(fa4=False) == cpu
    assert cpu.fallback(fa4=False) == OneCall(attention=False, rows=False)
    assert ALL_IN_ONE.fallback() == OneCall(norms=False)     # the norms alone first
    odd = OneCall(attention=False, recurrences=False)
    assert odd not in WAYS and odd.fallback() == PER_FORK
    assert CHUNKS.name == "recurrences" and CHUNKS.fallback() == PER_FORK
    assert PER_FORK.fallback() is None


def test_gdn_each_is_gdn_per_sequence():
    """kernels.gdn_each (the pure-torch twin of fla's one call over [B, T] rows) and
    KernelSet.recurrences: each sequence's output and state are gdn's over it alone."""
    from adapters.model import kernels
    g = torch.Generator().manual_seed(2)
    b, t, hk, hv, kd, vd = 3, 70, 2, 4, 16, 8
    q, k = (torch.randn(b, t, hk, kd, generator=g) for _ in range(2))
    v = torch.randn(b, t, hv, vd, generator=g)
    gate = -torch.rand(b, t, hv, generator=g)
    beta = torch.rand(b, t, hv, generator=g)
    state = torch.randn(b, hv, kd, vd, generator=g)
    o, s = kernels.TORCH.recurrences(q, k, v, gate, beta, state)
    assert o.shape == (b, t, hv, vd) and s.shape == (b, hv, kd, vd)
    for i in range(b):
        oi, si = kernels.TORCH.gdn(q[i], k[i], v[i], gate[i], beta[i], state[i])
        assert torch.equal(o[i], oi) and torch.equal(s[i], si)


def test_batch_slots_lie_in_one_block_so_their_states_stack_as_a_view(tiny):
    """Runners.batch_slots: the largest batch's slots made at once (StateSlots.block), any
    first b of them stacked per layer as a view of one tensor (slots.stacked), fed states
    read through it; other tensors stack as a copy; more than the largest batch is refused."""
    from adapters.runners.slots import stacked
    runners = Runners(tiny, G)
    slots = runners.batch_slots(4)
    assert len(slots) == 4 and len(runners.batch_slots(8)) == 8
    convs = [s.inputs[0][0] for s in slots]
    view = stacked(convs)
    assert view.shape == (4, *convs[0].shape) and view.data_ptr() == convs[0].data_ptr()
    spec = state_spec(tiny)
    gdn = [(torch.randn(spec.conv_dim, spec.conv_width).to(tiny.dtype),
            torch.randn(*spec.recurrent_shape)) for _ in range(spec.num_gdn)]
    slots[2].feed(gdn)
    assert torch.equal(stacked([s.inputs[0][1] for s in slots])[2], gdn[0][1])
    apart = [torch.zeros(3, 2), torch.ones(3, 2)]
    copy = stacked(apart)
    assert torch.equal(copy, torch.stack(apart)) and copy.data_ptr() != apart[0].data_ptr()
    assert stacked([convs[1], convs[0]]).data_ptr() != convs[1].data_ptr()   # out of order
    with pytest.raises(ValueError, match="at most 8 forks"):
        runners.batch_slots(9)


def test_question_runners_take_the_row_invariant_ops_only_where_they_batch(tiny, monkeypatch):
    """Runners.question_ops: with the compiled ops inside graphs (CUDA; faked here), the
    buckets that batch (at most BUCKET rows) get ops.row_invariant_ops, longer ones and a
    model whose heads model.rowwise does not take the chunk runner's; eagerly, the eager
    ops."""
    import dataclasses

    from adapters.model import ops, rowwise
    runners = Runners(tiny, 4 * G)
    assert runners.question_ops(G) is ops.EAGER                  # the CPU: eager ops
    fused = ops.Ops()
    monkeypatch.setattr(runners.chunk, "use_graphs", True)
    monkeypatch.setattr(runners.chunk, "ops", fused)
    inv = runners.question_ops(G)
    assert inv.norm_rope is rowwise.norm_rope and inv.gated_rms_norm is rowwise.gated_rms_norm
    assert inv.rms_norm is fused.rms_norm
    assert runners.question_ops(runners.BUCKET).gdn_gates is rowwise.gdn_gates
    assert runners.question_ops(2 * runners.BUCKET) is fused      # never batched
    odd = dataclasses.replace(tiny.cfg, head_dim=48)
    monkeypatch.setattr(tiny, "cfg", odd)
    assert not rowwise.fits(odd) and runners.question_ops(G) is fused


def test_a_runner_with_the_fused_conv_and_gates_runs_them_per_fork(tiny, monkeypatch):
    """With the op set's fused conv and gates (ops.conv_gates, fused_ops(compile_conv=True)),
    which take one sequence, a batch says its conv runs one call a fork (OneCall.conv off)
    and still gives each fork its runner's bits."""
    import dataclasses

    from adapters.model import ops
    runners = Runners(tiny, G)
    alone = runners.for_rows(G)
    monkeypatch.setattr(alone, "ops", dataclasses.replace(ops.EAGER, conv_gates=ops.conv_gates))
    batch = BatchRunner(alone, runners.batch_slots(2))
    assert batch.calls.parts == ("recurrences", "rows", "norms")
    forks = _forks(tiny, 2, 2 * G, seed=12)
    if not tiny.gemms_keep_tile_bits(2 * G, G):
        pytest.skip("this CPU's GEMMs give a 64-row block other bits in a batch")
    for (ids, p, kv, gdn), h in zip(forks, batch.run(forks)):
        assert torch.equal(h, alone.run(ids, p, kv, gdn)[0])


def test_use_sets_a_way_as_the_batch_can_run_it(tiny):
    """BatchRunner.use: the way given, its attention off without FA4 (as the constructor
    sets it); the way it runs already changes nothing."""
    from adapters.runners.batch import ALL_IN_ONE, PER_FORK, OneCall
    runners = Runners(tiny, G)
    batch = runners.question_batch(G, 2)
    assert batch.calls == OneCall(attention=False)
    batch.use(PER_FORK)
    assert batch.calls == PER_FORK and batch.fall_back() is False
    batch.use(ALL_IN_ONE)
    assert batch.calls == OneCall(attention=False)
    assert batch.fall_back() and batch.calls == OneCall(attention=False, rows=False)


@pytest.mark.parametrize("num_seqs", [2, 4])
def test_a_chunk_batch_gives_each_session_its_chunk_runners_bits_and_states(tiny, num_seqs):
    """Runners.chunk_batch: grid chunks of several sessions, each at its own position over
    pages of its own in one pool, in one forward (the CPU: SDPA through each one's pages,
    starting with every other part over all rows, Runners.chunk_way) give each
    session the hidden rows, KV rows and GDN states the chunk runner gives it alone, bit for
    bit, each way of CHUNK_WAYS; the states given are not changed. A question batch's slots
    return no states."""
    from adapters.runners.batch import CHUNK_WAYS
    runners = Runners(tiny, G)
    batch = runners.chunk_batch(num_seqs)
    assert batch is runners.chunk_batch(num_seqs) and runners.chunk_batch(3) is None
    assert batch.calls == runners.chunk_way() == CHUNK_WAYS[0] and batch.t == G and \
        not batch.one_position
    spec = state_spec(tiny)
    positions = [G * (2 * b + 1) for b in range(num_seqs)]      # 64, 192, 320, 448
    pages_each = [p // G + 1 for p in positions]
    base = paged_kv(spec, G, G * sum(pages_each), seed=num_seqs)
    g = torch.Generator().manual_seed(num_seqs)
    items, at = [], 0
    for pos, n in zip(positions, pages_each):
        kv = PagedKv(base.pool, base.pages[at:at + n])
        at += n
        gdn = [(torch.randn(spec.conv_dim, spec.conv_width, generator=g).to(tiny.dtype),
                torch.randn(*spec.recurrent_shape, generator=g) * 0.1)
               for _ in range(spec.num_gdn)]
        ids = torch.randint(0, tiny.cfg.vocab_size, (G,), generator=g).tolist()
        items.append((ids, pos, kv, gdn))
    if not tiny.gemms_keep_tile_bits(num_seqs * G, G):
        pytest.skip("this CPU's GEMMs give a 64-row block other bits in a batch")
    kept = [[(c.clone(), r.clone()) for c, r in gdn] for *_, gdn in items]
    for way in CHUNK_WAYS:
        batch.use(way)
        assert batch.calls == way
        got = batch.read(items)
        written = [_rows(kv, pos) for _, pos, kv, _ in items]
        for (ids, pos, kv, gdn), (h, states), rows, old in zip(items, got, written, kept):
            assert all(torch.equal(a, c) and torch.equal(b, d)
                       for (a, b), (c, d) in zip(gdn, old))
            want_h, want_states = runners.chunk.run(ids, pos, kv, gdn)
            assert torch.equal(h, want_h), way
            assert len(states) == len(want_states) == spec.num_gdn
            assert all(torch.equal(a, c) and torch.equal(b, d)
                       for (a, b), (c, d) in zip(states, want_states)), way
            assert all(torch.equal(x, y) for x, y in zip(rows, _rows(kv, pos))), way
    with pytest.raises(RuntimeError, match="return no states"):
        runners.question_batch(G, 2).read(items[:2])


def test_a_mixed_batch_gives_each_fork_its_own_buckets_bits(tiny):
    """Runners.mixed_batch on the CPU (SDPA a fork): a 128-row question (the grid's chunk
    runner at grid 128) beside two 64-row ones at one position, in one forward; each fork
    gets the hidden rows and KV rows its own bucket's runner gives it alone."""
    grid, pos = 2 * G, 4 * G
    runners = Runners(tiny, grid)
    batch = runners.mixed_batch([100, 30, 40])
    assert batch.ts == (2 * G, G, G) and batch.t is None and batch.key == (3, (2 * G, G, G))
    assert [g.t for g in batch.row_groups] == [2 * G, G] and batch.offsets == (0, 128, 192, 256)
    assert runners.captures()["question_batches"] == ["128+64+64"]
    if not tiny.gemms_keep_tile_bits(4 * G, G):
        pytest.skip("this CPU's GEMMs give a 64-row block other bits in a batch")
    spec = state_spec(tiny)
    base = paged_kv(spec, grid, pos + 3 * grid, seed=4)
    g = torch.Generator().manual_seed(4)
    forks = []
    for b, t in enumerate(batch.ts):
        kv = PagedKv(base.pool, base.pages[:pos // grid] + [base.pages[pos // grid + b]])
        gdn = [(torch.randn(spec.conv_dim, spec.conv_width, generator=g).to(tiny.dtype),
                torch.randn(*spec.recurrent_shape, generator=g) * 0.1)
               for _ in range(spec.num_gdn)]
        forks.append((torch.randint(0, tiny.cfg.vocab_size, (t,), generator=g).tolist(), pos,
                      kv, gdn))
    hidden = batch.run(forks)
    written = [_rows(kv, pos) for _, _, kv, _ in forks]
    for (ids, p, kv, gdn), h, rows in zip(forks, hidden, written):
        alone, _ = runners.for_rows(len(ids)).run(ids, p, kv, gdn)
        assert h.shape == (len(ids), tiny.cfg.hidden_size) and torch.equal(h, alone)
        assert all(torch.equal(x, y) for x, y in zip(rows, _rows(kv, p)))


def test_mixed_batches_are_refused_where_their_forks_do_not_group(tiny):
    """A runner a fork: one runner's forks next to each other, one runner a row count, one
    position for all; Runners.mixed_batch only for two buckets or more within a batch's
    size; a batch's forks of the wrong length are refused before anything runs."""
    runners = Runners(tiny, 2 * G)
    small, big = runners.for_rows(G), runners.for_rows(2 * G)
    slots = runners.batch_slots(3)
    with pytest.raises(ValueError, match="next to each other; fork 2's is not next to the"):
        BatchRunner([small, big, small], slots)
    other = Runners(tiny, 2 * G).for_rows(G)               # a second runner of 64 rows
    with pytest.raises(ValueError, match="fork 1's is another runner of that row count"):
        BatchRunner([small, other, big], slots)
    with pytest.raises(ValueError, match="several row counts share one position"):
        BatchRunner([big, small, small], slots, one_position=False)
    with pytest.raises(ValueError, match="a runner a fork: 2 runners for 3 forks"):
        BatchRunner([big, small], slots)
    assert runners.mixed_batch([5, 6]) is None               # one bucket
    assert runners.mixed_batch([100] + [5] * 8) is None      # past the largest batch
    assert runners.mixed_batch([5, 100]).ts == (2 * G, G)    # largest bucket first
    assert runners.mixed_order([5, 100, 6]) == [1, 0, 2]
    assert runners.mixed_batch_shapes() == []                # 256 rows: past this grid
    assert Runners(tiny, 8 * G).mixed_batch_shapes() == [
        (256, 64), (256, 64, 64), (256, 64, 64, 64),
        (256, 128), (256, 128, 128), (256, 128, 128, 128)]
    assert runners.mixed_rows([100, 5]) == (128, 64) and runners.mixed_rows([300, 5]) is None
    batch = runners.mixed_batch([100, 5])
    forks = _forks(tiny, 2, 2 * G, seed=3, page_rows=2 * G)
    with pytest.raises(ValueError, match=r"\[128, 64\] ids"):
        batch.run(forks)                                      # 64 ids where 128 are due


def test_runners_of_other_fused_projections_are_refused_with_a_clear_error(tiny_tensors):
    """Two Runners fuse the projections each into a FusedProjections of its own: their
    runners cannot share a batch, and saying so compares them by identity (a review found
    `!=` on their tensors raising RuntimeError instead)."""
    from adapters.model.config import PRESETS
    from adapters.model.qwen35 import ModelInfo
    from adapters.model.weights import build_model, fingerprint
    model = build_model(PRESETS["tiny"], tiny_tensors,
                        ModelInfo("random:tiny", fingerprint(tiny_tensors), True))
    a, b = Runners(model, 2 * G, fused=True), Runners(model, 2 * G, fused=True)
    assert a.chunk.proj is not None and a.chunk.proj is not b.chunk.proj
    with pytest.raises(ValueError, match="fork 1's runner \\(64 rows\\) differs in proj"):
        BatchRunner([a.for_rows(2 * G), b.for_rows(G)], a.batch_slots(2))
    assert BatchRunner([a.for_rows(2 * G), a.for_rows(G)], a.batch_slots(2)).ts == (2 * G, G)


def test_no_mixed_batch_joins_a_grid_sized_bucket_of_other_ops(tiny, monkeypatch):
    """At a grid of BUCKET rows the router question's bucket is the grid's chunk runner; on
    CUDA its op set is not the question runners' (their row-invariant ops, question_ops), so
    no mixed batch takes it: mixed_rows None, no warm-up shape, and the graph adapter neither
    batches such questions in one forward nor fails its warm-up over them."""
    import dataclasses

    from shadow_plugin.reader.reader import Reader
    r = Reader(tiny, grid=256, cuda_graphs=True)
    runners, a = r.adapter.runners, r.adapter
    assert runners.mixed_rows([200, 5]) == (256, 64)           # one op set (the CPU's)
    other = dataclasses.replace(runners.chunk.ops)              # as CUDA's question ops
    monkeypatch.setattr(runners, "question_ops", lambda t: other)
    assert runners.mixed_rows([200, 5]) is None and runners.mixed_batch([200, 5]) is None
    assert runners.mixed_rows([100, 5]) == (128, 64)            # below the grid: still
    assert all(rows[0] < 256 for rows in runners.mixed_batch_shapes())
    a._prepare_mixed([(256, 64)], None)                         # nothing made, nothing raised
    assert not a.batch_bits and not a.batches([200, 5], [512, 512])
