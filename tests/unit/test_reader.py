"""Reader behaviour beyond the property test: bad input, checkpoint policy, episode starts."""
import random

import numpy as np
import pytest
import torch
from helpers import rand_ids  # noqa: E402

from shadow_plugin.reader import lines
from shadow_plugin.reader.reader import Reader

G = 64
IM_START, IM_END, USER, ASSISTANT, NL, TOOL_RESPONSE = 248045, 248046, 846, 74455, 198, 248066
GEN_PROMPT = [IM_START, ASSISTANT, NL, 248068, NL]


def _user(n, seed, tool=False):
    body = ([TOOL_RESPONSE] if tool else []) + rand_ids(n, seed)
    return [IM_START, USER, NL] + body + [IM_END, NL]


@pytest.fixture
def reader(tiny):
    r = Reader(tiny, grid=G, max_checkpoints=3)
    r.feed("s", rand_ids(150), "prompt")
    r.read("s")
    return r


def _unchanged(reader, before_ids, before_c, before_state):
    assert reader.ids("s") == before_ids and reader.committed("s") == before_c
    after = reader.state_tensors("s")
    assert all(torch.equal(before_state[k], after[k]) for k in before_state)


@pytest.mark.parametrize("ids,match", [
    ([1, -3], r"ids\[1\] = -3 is outside the vocabulary"),
    ([1, 248320], r"ids\[1\] = 248320 is outside"),
    ([1, 2.5], r"ids\[1\] = 2.5 is not an integer"),
    ([True], r"ids\[0\] = True is not an integer"),
    (torch.zeros(2, 3, dtype=torch.long), r"1-D, got shape \[2, 3\]"),
    (np.zeros(3, dtype=np.float32), "must be integers"),
    ("hello", "1-D sequence"),
    (5, "1-D sequence"),
    ({1: 2}, "1-D sequence"),
    ({1, 2}, "1-D sequence"),
])
def test_bad_ids_raise_and_change_nothing(reader, ids, match):
    before = (reader.ids("s"), reader.committed("s"),
              {k: v.clone() for k, v in reader.state_tensors("s").items()})
    for kind in ("prompt", "output"):
        with pytest.raises(ValueError, match=match):
            reader.feed("s", ids, kind)
    _unchanged(reader, *before)


def test_bad_calls(reader):
    with pytest.raises(KeyError, match="unknown session 'nope'"):
        reader.read("nope")
    with pytest.raises(KeyError, match="nope"):
        reader.feed("nope", [1], "output")
    with pytest.raises(KeyError):
        reader.ask("nope", "q", ["a", "b"])
    with pytest.raises(ValueError, match="kind"):
        reader.feed("s", [1], "input")
    with pytest.raises(ValueError, match="2 to 26"):
        reader.ask("s", "q", ["only"])
    with pytest.raises(ValueError, match="2 to 26"):
        reader.ask("s", "q", [str(i) for i in range(27)])
    with pytest.raises(ValueError, match="at = 151 is outside"):
        reader.ask("s", "q", ["a", "b"], at=151)
    with pytest.raises(ValueError, match="1 to 256 characters"):
        reader.feed("x" * 257, [1], "prompt")
    with pytest.raises(ValueError, match="1 to 256"):
        reader.feed("", [1], "prompt")
    with pytest.raises(ValueError, match="multiple of 64"):
        Reader(reader.model, grid=100)
    with pytest.raises(ValueError, match="repeats an earlier choice"):
        reader.ask("s", "q", ["a", "a"])
    with pytest.raises(ValueError, match="question must not be empty"):
        reader.ask("s", " ", ["a", "b"])
    with pytest.raises(ValueError, match="episode_start"):
        reader.feed("s", [1], "prompt", episode_start="no")
    for bad in ("2", 0.5, -1):
        with pytest.raises(ValueError, match="max_chunks"):
            reader.read("s", max_chunks=bad)
    assert reader.committed("s") == 128 and len(reader.ids("s")) == 150


def test_hostile_session_ids_are_plain_keys(tiny):
    r = Reader(tiny, grid=G)
    for sid in ("../x", "a/b\\c", "é" * 256, " "):
        r.feed(sid, [1, 2, 3], "prompt")
        assert r.ids(sid) == [1, 2, 3]


def test_new_user_message_rolls_back_to_episode_start_not_zero(tiny):
    """An episode of tool turns, then a new user message rewriting from the episode's first
    assistant turn: the rollback lands on the episode-start checkpoint even when more tool
    turns than max_checkpoints came in between."""
    r = Reader(tiny, grid=G, max_checkpoints=2)
    prompt = ([IM_START, lines.SYSTEM, NL] + rand_ids(40, 1) + [IM_END, NL] + _user(90, 2)
              + GEN_PROMPT)
    r.feed("s", prompt, "prompt")
    r.read("s")
    episode_line = lines.prompt_line(prompt, G)
    assert r.checkpoint_positions("s") == [episode_line]
    first_answer = len(prompt) - 2        # where "<think>\n" of the first assistant turn starts
    held = prompt
    for t in range(5):                    # tool turns: output, tool response, read
        r.feed("s", rand_ids(70, 10 + t) + [IM_END], "output")
        held = r.ids("s") + [NL] + _user(60, 20 + t, tool=True) + GEN_PROMPT
        res = r.feed("s", held, "prompt")
        assert not res.episode_start and res.rolled_back_to is None
        r.read("s")
    assert episode_line in r.checkpoint_positions("s") and len(r.checkpoint_positions("s")) == 2
    # the new user message: the first assistant turn loses its think block
    rewritten = held[:first_answer] + held[first_answer + 2:] + _user(30, 99) + GEN_PROMPT
    res = r.feed("s", rewritten, "prompt")
    assert res.episode_start and res.first_difference == first_answer
    assert res.rolled_back_to == episode_line > 0
    r.read("s")
    assert r.check_exact("s")


def test_checkpoint_limit_keeps_newest(tiny):
    r = Reader(tiny, grid=G, max_checkpoints=3)
    ids = []
    for t in range(6):
        ids = ids + rand_ids(G, t)
        r.feed("s", ids, "prompt", episode_start=False)
        r.read("s")
    assert r.checkpoint_positions("s") == [4 * G, 5 * G, 6 * G]


def test_ask_at_checkpoint_boundaries_matches_fresh(reader, tiny):
    for at in (1, 63, 64, 65, 128, 150):
        a = reader.ask("s", "Is it code?", ["yes", "no"], at=at)
        fresh = Reader(tiny, grid=G)
        fresh.feed("f", reader.ids("s")[:at], "prompt")
        assert fresh.ask("f", "Is it code?", ["yes", "no"], at=at).probs == a.probs
        assert a.num_forwarded_tokens > 0 and a.at == at


def test_output_before_prompt_and_empty_prompt(tiny):
    r = Reader(tiny, grid=G)
    with pytest.raises(ValueError, match="at least one id"):
        r.feed("s", [], "prompt")
    with pytest.raises(KeyError):
        r.ids("s")


def test_sessions_past_max_positions_are_read_and_flagged(tiny_tensors):
    import dataclasses

    from adapters.model.config import PRESETS
    from adapters.model.qwen35 import ModelInfo
    from adapters.model.weights import build_model
    cfg = dataclasses.replace(PRESETS["tiny"], max_position_embeddings=100)
    model = build_model(cfg, tiny_tensors, ModelInfo("short", "x", True))
    r = Reader(model, grid=G)
    r.feed("s", rand_ids(150), "prompt")
    r.read("s")
    assert r.committed("s") == 128 and r.check_exact("s")
    assert r.stats()["sessions"]["s"]["beyond_max_positions"] is True
    assert r.ask("s", "q", ["a", "b"]).beyond_max_positions is True


def test_prepare_fork_reads_below_c_in_steps_and_is_dropped_when_stale(tiny):
    """prepare_fork re-reads a base below C one chunk a call; the ask that follows uses it and
    answers as an ask without it; after a prompt that changes ids below the line, the stale
    base is not used (the answer still equals a fresh reader's)."""

    from shadow_plugin.chat.router import ROUTER
    from shadow_plugin.reader.reader import Reader
    rng = random.Random(11)
    ids = [rng.randrange(1000, 240000) for _ in range(5 * 64 + 9)]
    r = Reader(tiny, grid=64)
    r.feed("s", ids, "prompt")
    r.read("s")
    q, ch = ROUTER.question, list(ROUTER.choices)
    want = r.ask("s", q, ch, at=3 * 64 + 2)
    assert [r.prepare_fork("s", 3 * 64 + 2) for _ in range(4)] == [1, 1, 1, 0]
    assert r.prepare_fork("s", 5 * 64) == 0                   # at C: nothing to prepare
    assert r.prepare_fork("s", 2 * 64, max_chunks=10) == 2    # another line: a new base
    assert r.prepare_fork("s", 3 * 64 + 2, max_chunks=10) == 3
    got = r.ask("s", q, ch, at=3 * 64 + 2)
    assert got.probs == want.probs and r._scratch == {} and r.check_exact("s")
    r.feed("t", ids, "prompt")                                  # a second session: bases
    r.read("t")                                                 # are kept per session
    steps = [(r.prepare_fork("s", 3 * 64 + 2), r.prepare_fork("t", 2 * 64 + 9))
             for _ in range(4)]
    assert steps == [(1, 1), (1, 1), (1, 0), (0, 0)]
    for bad in (None, 0, True, 1.5):
        with pytest.raises(ValueError, match="max_chunks must be an integer >= 1"):
            r.prepare_fork("s", 5, bad)
    changed = ids[:100] + [7] * 250
    r.feed("s", changed, "prompt")                              # rolls back below the line
    r.read("s")
    fresh = Reader(tiny, grid=64)
    fresh.feed("f", changed, "prompt")
    fresh.read("f")
    assert r.ask("s", q, ch, at=3 * 64 + 2).probs == fresh.ask("f", q, ch, at=3 * 64 + 2).probs
