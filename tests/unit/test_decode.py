"""The decode loop (runners.decode: each token fed back on the device, the host checking for stop
ids every few steps) against the step-by-step loop of fork.generate without runners."""
from __future__ import annotations

import pytest
import torch

from shadow_plugin.reader.reader import Reader


def _reader(tiny, runners: bool) -> Reader:
    r = Reader(tiny, grid=64, cuda_graphs=runners)
    ids = torch.randint(0, 248000, (150,), generator=torch.Generator().manual_seed(3)).tolist()
    r.feed("s", ids, "prompt")
    r.read("s")
    return r


def test_decode_loop_gives_the_step_by_step_ids(tiny):
    """Same ids with and without runners (on the CPU the runner is the eager forward's bits),
    a stop id found late by the loop still ends the output at its first occurrence, and the
    session's state is untouched."""
    loop, steps = _reader(tiny, True), _reader(tiny, False)
    want = steps.generate("s", [11, 12, 13], max_new_tokens=20, stop_ids=()).ids
    got = loop.generate("s", [11, 12, 13], max_new_tokens=20, stop_ids=()).ids
    assert got == want and len(got) == 20
    stop = next(t for t in want if t != want[0])  # a random model soon repeats one token
    first = want.index(stop)
    assert first >= 1
    cut = loop.generate("s", [11, 12, 13], max_new_tokens=20, stop_ids=(stop,)).ids
    assert cut == want[:first + 1]
    assert loop.check_exact("s")


def test_decode_loop_refuses_a_runner_of_many_rows_and_a_short_buffer(tiny):
    from paged import paged_kv

    from adapters import spec_for
    from adapters.runners.decode import DecodeLoop
    from adapters.runners.graphs import ChunkGraphs
    from block_store.memory.layout import zero_gdn
    with pytest.raises(ValueError, match="single-token runner, got t = 64"):
        DecodeLoop(tiny, ChunkGraphs(tiny, 64))
    loop = DecodeLoop(tiny, ChunkGraphs(tiny, 1))
    kv = paged_kv(spec_for(tiny.cfg, "cpu", torch.float32), 64, 10)   # one page: 64 rows
    with pytest.raises(ValueError, match="cannot take 8 steps from 60"):
        loop.run(3, 60, kv, zero_gdn(spec_for(tiny.cfg, "cpu", torch.float32)), 8, set())


def test_steps_past_a_late_stop_id_are_counted(tiny):
    """A stop id seen at the next check still ends the ids there, and the steps the loop ran
    past it count in num_forwarded_tokens (the mean ms a step is over the steps run)."""
    r = _reader(tiny, True)
    want = r.generate("s", [11, 12, 13], max_new_tokens=20, stop_ids=()).ids
    stop = next(t for t in want if t != want[0])
    first = want.index(stop)                      # the stop id's step; checked at step 8
    gen = r.generate("s", [11, 12, 13], max_new_tokens=20, stop_ids=(stop,))
    base = r.generate("s", [11, 12, 13], max_new_tokens=1, stop_ids=()).num_forwarded_tokens
    assert gen.ids == want[:first + 1]
    assert gen.num_forwarded_tokens == base + 8   # 8 steps ran, though `first` sufficed
