"""A question longer than one grid on CUDA (skipped without one; issue 34): its tail and its
first piece go through the states-keeping runners (adapter.read_rows), its next pieces through
the chunk runner (adapter.read_chunk at grid lines, the CUDA graphs' static buffers)
with another session's chunks read between two pieces, as the service does between two holds
of its lock, and its letters' logits equal those of the same question asked of a fresh reader
holding the same ids (nothing between its pieces), bit for bit; so do the answers' probs."""
import random

import pytest
import torch
from helpers import fork_logits

from shadow_plugin import Reader
from shadow_plugin.reader import fork

MODEL = "random:qwen3.5-0.8b"


def _ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 240000) for _ in range(n)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device with fla")
@pytest.mark.parametrize("attention", ["table", "fa4"])
def test_a_long_question_in_pieces_gives_a_fresh_readers_logits_bit_for_bit(attention):
    from adapters.attention import fa4
    from adapters.model import load_model
    model = load_model(MODEL, device="cuda")
    if attention == "fa4" and not fa4.available(model.device, model.dtype):
        pytest.skip("FlashAttention-4 needs Hopper and flash-attn-4")
    reader = Reader(model, attention=attention)
    g = reader.config.grid
    ids, other, q_ids = _ids(3 * g + 77, 0), _ids(12 * g, 1), _ids(3 * g + 100, 2)
    letters = [1000 + i for i in range(4)]
    reader.feed("s", ids, "prompt")
    reader.read("s")
    reader.feed("other", other, "prompt")               # read a chunk between two pieces

    got, num_pieces = fork_logits(reader, "s", q_ids, letters,
                                  between=lambda: reader.read("other", max_chunks=1))
    assert num_pieces == fork.num_pieces(len(ids), len(q_ids), g)[0] >= 3   # 3 at grid 512
    assert reader.committed("other") == num_pieces * g
    pending = reader.begin_ask("s", q_ids, list("abcd"))
    while reader.advance(pending):
        reader.read("other", max_chunks=1)
    asked = reader.finish_ask(pending)
    assert reader.committed("other") == 2 * num_pieces * g

    fresh = Reader(model, attention=attention)
    assert fresh.adapter.identity() == reader.adapter.identity()
    fresh.feed("s", ids, "prompt")
    fresh.read("s")
    want, _ = fork_logits(fresh, "s", q_ids, letters)
    assert got.dtype == want.dtype == torch.float32 and got.is_cuda
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (got, want)
    assert fresh.ask("s", q_ids, list("abcd")).probs == asked.probs
    assert reader.check_exact("s") and reader.check_exact("other")
