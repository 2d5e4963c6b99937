"""Questions' tails on CUDA (skipped without one): the tail ids[line:cut] through the
states-keeping runners (GraphAdapter.read_rows: CUDA graphs of 64 to grid - 64 rows), the
question from cut (a multiple of 64: FA4's sub-pages) through its bucket's runner. A question
on a kept tail gives, bit for bit, the letters' logits of the same question without one, of a
fresh reader, and of the forwards done by hand through the adapter; several questions at once
give each their bits alone; the sessions stay exact."""
import random

import pytest
import torch
from helpers import fork_logits, logits_by_hand

from shadow_plugin import Reader
from shadow_plugin.reader import fork

MODEL = "random:qwen3.5-0.8b"
LETTERS = [1000 + i for i in range(9)]


def _ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 240000) for _ in range(n)]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype == torch.float32 and torch.equal(a.view(torch.int32),
                                                              b.view(torch.int32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device with fla")
@pytest.mark.parametrize("attention", ["table", "fa4"])
def test_a_kept_tail_gives_a_fresh_readers_logits_bit_for_bit(attention):
    from adapters.attention import fa4
    from adapters.model import load_model
    model = load_model(MODEL, device="cuda")
    if attention == "fa4" and not fa4.available(model.device, model.dtype):
        pytest.skip("FlashAttention-4 needs Hopper and flash-attn-4")
    reader = Reader(model, attention=attention)
    g = reader.config.grid
    q_ids = _ids(170, 9)
    for n in (8 * g + 506, 8 * g + 300, 8 * g + 256, 8 * g + 130, 8 * g + 20):
        ids = _ids(n, n)
        reader.feed("s", ids, "prompt")
        reader.read("s")
        made = reader.make_tail("s")
        assert made == (n % g >= fork.min_tail(g))
        kept = fork_logits(reader, "s", q_ids, LETTERS, reader.tails)[0]
        fresh = Reader(model, attention=attention, max_tails=0)
        fresh.feed("s", ids, "prompt")
        fresh.read("s")
        alone = fork_logits(fresh, "s", q_ids, LETTERS)[0]
        assert _same(kept, alone), (n, kept, alone)
        assert _same(kept, logits_by_hand(fresh.adapter, ids, q_ids, LETTERS)), n
        many = reader.ask_many("s", [(q_ids, list("abcdefghi")), (q_ids[:90], list("ab"))])
        assert many[1].probs == fresh.ask("s", q_ids[:90], list("ab")).probs
        assert reader.check_exact("s")
        reader.drop("s")
