"""Grid chunks of several sessions in one forward inside CUDA graphs (Runners.chunk_batch; issue
36, item 2; skipped without a Hopper GPU and flash-attn-4): a reader warmed up for batches of
up to 4 sessions checks each batch size against its chunks read alone, and every session it
reads in batches is committed as read alone, bit for bit, whichever way its check went (a size
that gave other bits reads one chunk at a time)."""
import random

import pytest
import torch
from helpers import vocab_ids

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device with fla")
G = 512


@pytest.fixture(scope="module")
def model():
    from adapters.attention import fa4
    from adapters.model import load_model
    model = load_model("random:qwen3.5-0.8b", device="cuda")
    if not fa4.available(model.device, model.dtype):
        pytest.skip("chunk batches run FA4 inside the graph: Hopper and flash-attn-4")
    return model


def test_a_warmed_reader_reads_sessions_in_batches_as_alone(model):
    from shadow_plugin.reader.reader import Reader
    rng = random.Random(7)
    sizes = [12 * G + 9, 10 * G, 14 * G + 100, 9 * G]     # past 4k: one FA4 split count
    ids = {f"s{i}": vocab_ids(rng, n) for i, n in enumerate(sizes)}
    batched, alone = Reader(model), Reader(model)
    warm_s = batched.warm_up(batch_sessions=4)
    stats = batched.adapter.graph_stats()
    bits = stats["chunk_batch_bits"]                 # the device's facts: printed, not assumed
    print(f"warm-up {warm_s:.1f} s, chunk batches {bits}, ways "
          f"{stats['chunk_batch_one_call']}, captures {stats['num_captures']}")
    assert set(bits) == {"2", "4"} and stats["num_failed_captures"] == 0
    captures = stats["num_captures"]
    for r in (batched, alone):
        for s, x in ids.items():
            r.feed(s, x, "prompt")
    while batched.read_batch(list(ids)).num_chunks:
        pass
    a = batched.adapter
    print(f"batched forwards {a.num_batched_forwards}, chunks {a.num_batched_chunks}")
    assert (a.num_batched_forwards > 0) == (bits["4"] or bits["2"])
    assert a.graph_stats()["num_captures"] == captures    # nothing captured after the warm-up
    for s in ids:
        alone.read(s)
        x, y = batched.state_tensors(s), alone.state_tensors(s)
        assert batched.committed(s) == alone.committed(s) == len(ids[s]) // G * G
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), s
        assert batched.check_exact(s)


@pytest.mark.parametrize("row_invariant", [False, True])
def test_a_chunk_batch_keeps_its_starting_way_and_each_chunks_bits(model, row_invariant):
    """Runners.chunk_batch(4) at 8k-10k with the compiled chunk ops and with the row-invariant
    ones (Runners(row_invariant=True): every part but FA4 in one call): each chunk's hidden
    rows, GDN states and KV rows equal the chunk runner's alone, bit for bit, replayed from
    the batch's graph (printed: the way, and whether it kept them)."""
    from adapters.runners.batch import chunk_way
    from adapters.runners.runners import Runners
    from block_store import PagedKv
    from evals.question_bench import scratch_pool
    runners = Runners(model, G, row_invariant=row_invariant)
    batch = runners.chunk_batch(4)
    assert batch.calls == runners.chunk_way() == chunk_way(row_invariant)
    pool, shared, own, gdn = scratch_pool(model, G, 20, 4, 11)
    positions = [16 * G, 17 * G, 18 * G, 19 * G]                  # one FA4 split count
    assert len({runners.chunk_splits(p) for p in positions}) == 1
    g = torch.Generator().manual_seed(11)
    items = [(torch.randint(0, model.cfg.vocab_size, (G,), generator=g).tolist(), p,
              PagedKv(pool, shared[:p // G] + [own[b]]), gdn[b])
             for b, p in enumerate(positions)]
    for _ in range(2):                                   # the second replays the graph
        got = batch.read(items)
    rows = [[x[own[b]].clone() for pair in pool.layers() for x in pair] for b in range(4)]
    same = []
    for b, (item, (h, states)) in enumerate(zip(items, got)):
        want_h, want_states = runners.chunk.run(*item)
        same.append(torch.equal(h, want_h) and all(
            torch.equal(x, y) for p, q in zip(states, want_states) for x, y in zip(p, q))
            and all(torch.equal(x, y) for x, y in zip(
                rows[b], [x[own[b]] for pair in pool.layers() for x in pair])))
    print(f"row_invariant {row_invariant}: way {batch.calls.name}, chunks kept their bits "
          f"{same}, path {runners.path}")
    assert all(same)
