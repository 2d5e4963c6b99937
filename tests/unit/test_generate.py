"""Greedy fork decoding on top of a session: consistent with a plain forward, history-free,
and leaving the committed state as it was."""

import pytest
import torch
from helpers import rand_ids  # noqa: E402
from paged import paged_kv

from adapters import EagerAdapter, spec_for
from block_store.memory.layout import zero_gdn
from shadow_plugin.reader.exact import fresh_prefill
from shadow_plugin.reader.reader import Reader

G = 64


@pytest.fixture
def reader(tiny):
    r = Reader(tiny, grid=G)
    r.feed("s", rand_ids(200, 0), "prompt")
    r.read("s")
    return r


def _plain_logits(model, ids):
    """Logits [len(ids), vocab] of one whole forward from 0 (no chunking, no fork)."""
    cfg = model.cfg
    kv = paged_kv(spec_for(cfg, "cpu", torch.float32), 64, len(ids))
    h, _ = model(torch.tensor(ids), 0, kv, zero_gdn(spec_for(cfg, "cpu", torch.float32)))
    return model.logits(h).float()


def test_greedy_tokens_are_the_argmax_of_a_plain_forward(reader, tiny):
    prompt = rand_ids(7, 1)
    gen = reader.generate("s", prompt, max_new_tokens=6, stop_ids=())
    assert len(gen.ids) == 6 and gen.ms_per_token > 0
    seq = reader.ids("s") + prompt + list(gen.ids)
    logits = _plain_logits(tiny, seq)
    start = len(reader.ids("s")) + len(prompt) - 1
    for i, token in enumerate(gen.ids):
        row = logits[start + i]
        assert row[token] >= row.max() - 1e-4          # the argmax, up to fp32 rounding


def test_generate_leaves_the_state_and_depends_only_on_ids(reader, tiny):
    before = {k: v.clone() for k, v in reader.state_tensors("s").items()}
    gen = reader.generate("s", "Summarize.", max_new_tokens=5)
    after = reader.state_tensors("s")
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert reader.check_exact("s")
    assert reader.generate("s", "Summarize.", max_new_tokens=5).ids == gen.ids
    for at in (70, 150):                                  # below C: a scratch fork
        below = reader.generate("s", "Summarize.", max_new_tokens=4, at=at)
        fresh = Reader(tiny, grid=G)
        fresh.feed("f", reader.ids("s")[:at], "prompt")
        assert fresh.generate("f", "Summarize.", max_new_tokens=4, at=at).ids == below.ids
    text, g = reader.summarize("s", max_tokens=3)
    assert isinstance(text, str) and 1 <= len(g.ids) <= 3
    state = fresh_prefill(EagerAdapter(tiny, G), reader.ids("s")[:reader.committed("s")])
    assert all(torch.equal(state[k], reader.state_tensors("s")[k]) for k in state)


def test_generate_bad_input(reader):
    with pytest.raises(ValueError, match="max_new_tokens"):
        reader.generate("s", "x", max_new_tokens=0)
    with pytest.raises(ValueError, match="prompt must not be empty"):
        reader.generate("s", "  ")
    with pytest.raises(ValueError, match=r"prompt\[0\] = -1"):
        reader.generate("s", [-1])
    with pytest.raises(KeyError):
        reader.generate("nope", "x")
