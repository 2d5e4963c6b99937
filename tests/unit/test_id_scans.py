"""The C-speed scans over a turn's prompt against their one-id-at-a-time twins: the first
difference with the held ids, the last `<|im_start|>` (an episode's start), and the check of
the ids themselves (validate.token_ids's fast path against its loop)."""
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from block_store import checkpoints
from block_store.checkpoints import first_difference, first_difference_ref
from shadow_plugin import validate
from shadow_plugin.reader import lines

SPECIAL = [lines.IM_START, lines.ASSISTANT, lines.USER, lines.NEWLINE, lines.TOOL_RESPONSE]


@pytest.mark.parametrize("n", [0, 1, 4095, 4096, 4097, 3 * 4096, 20_000])
def test_first_difference_at_every_kind_of_place(n):
    rng = random.Random(n)
    held = [rng.randrange(50) for _ in range(n)]
    assert first_difference(held, list(held)) == n
    assert first_difference(held, held + [1, 2]) == n == first_difference(held + [3], held)
    for d in {0, n // 2, n - 1, 4095, 4096, 4097} - {-1}:
        if 0 <= d < n:
            new = list(held)
            new[d] += 1
            assert first_difference(held, new) == d == first_difference_ref(held, new)
            assert first_difference(held, new[:d + 1]) == d


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=300), st.lists(st.integers(0, 3), max_size=300),
       st.integers(1, 17))
def test_first_difference_equals_its_twin(a, b, block):
    old = checkpoints.COMPARE_BLOCK
    checkpoints.COMPARE_BLOCK = block            # small blocks: every boundary is crossed
    try:
        assert first_difference(a, b) == first_difference_ref(a, b)
    finally:
        checkpoints.COMPARE_BLOCK = old


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(SPECIAL + [5, 6, 7]), max_size=200), st.integers(1, 9))
def test_the_episode_start_equals_its_twin(prompt, block):
    old = lines.SCAN_BLOCK
    lines.SCAN_BLOCK = block
    try:
        assert lines.is_episode_start(prompt) == lines.is_episode_start_ref(prompt)
        for end in range(len(prompt) + 1):
            want = max((i for i in range(end) if prompt[i] == lines.IM_START), default=-1)
            assert lines.last_index(prompt, lines.IM_START, end) == want
    finally:
        lines.SCAN_BLOCK = old


def test_an_episode_behind_a_long_tool_output():
    """The user's message far behind the generation prompt (a 50k-id last message before it)
    and the same with a tool's response: both scans agree."""
    body = [5] * 50_000
    user = [lines.IM_START, lines.USER, lines.NEWLINE] + body
    gen = [lines.IM_START, lines.ASSISTANT, lines.NEWLINE]
    tool = [lines.IM_START, lines.USER, lines.NEWLINE, lines.TOOL_RESPONSE] + body
    assert lines.is_episode_start(user + gen) is True
    assert lines.is_episode_start(tool + gen) is False
    assert lines.is_episode_start(body + gen) is False      # no message before the prompt
    assert lines.is_episode_start(body) is False
    for p in (user + gen, tool + gen, body + gen, body, user):
        assert lines.is_episode_start(p) == lines.is_episode_start_ref(p)


def _loop(ids, vocab_size):
    """validate.token_ids's rule, one id at a time: the error it must name, else the ids."""
    for i, x in enumerate(ids):
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
            return f"ids[{i}] = {x!r} is not an integer token id"
        if not 0 <= int(x) < vocab_size:
            return f"ids[{i}] = {int(x)} is outside the vocabulary [0, {vocab_size})"
    return [int(x) for x in ids]


ODD = st.one_of(st.integers(-3, 12), st.booleans(), st.floats(0, 3), st.just(2 ** 70),
                st.integers(0, 9).map(np.int64), st.none(), st.just("3"))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 9), ODD), max_size=40), st.booleans())
def test_token_ids_fast_path_equals_the_loop(ids, as_tuple):
    ids = tuple(ids) if as_tuple else ids
    want = _loop(ids, 10)
    try:
        got = validate.token_ids(ids, 10)
    except ValueError as e:
        got = str(e)
    assert got == want
    assert not isinstance(got, list) or all(type(x) is int for x in got)


def test_scans_over_other_sequence_types_and_ends():
    """A list against a tuple or a range (equal ids, other types) and an end past the prompt:
    the same answers as the twins."""
    held = list(range(10_000))
    for new in (tuple(held), range(10_000), tuple(held[:5000]) + (7,) + tuple(held[5001:])):
        assert first_difference(held, new) == first_difference_ref(held, new)
    assert first_difference(held, tuple(held)) == 10_000
    p = [lines.IM_START, 5, 5]
    assert lines.last_index(p, lines.IM_START, 10) == 0
    assert lines.last_index(p, lines.IM_START, 0) == -1
