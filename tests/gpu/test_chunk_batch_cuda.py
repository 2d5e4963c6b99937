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
