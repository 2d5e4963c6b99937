"""evals.read_syncs: agents followed as the idle loop reads them, each read's parts split."""
import argparse
import collections
import random
import traceback

import pytest
import torch
from helpers import vocab_ids

from evals import read_syncs
from evals.vllm.agents import AgentScript
from shadow_plugin.reader.read_stats import ReadResult
from shadow_plugin.reader.reader import Reader

G = 64


def test_the_parts_name_the_longest_read_and_the_longest_bookkeeping():
    reads = [ReadResult(128, 2, 30.0, sync_ms=2.0, forward_ms=8.0),     # bookkeeping 20
             ReadResult(64, 1, 35.0, sync_ms=30.0, forward_ms=4.0, gc_ms=0.5,   # 1
                        cpu_ms=3.5),
             ReadResult(0, 0, 50.0)]                                    # read nothing: left out
    out = read_syncs.parts(reads)
    assert (out["num_reads"], out["num_chunks"], out["read_ms"]) == (2, 3, 65.0)
    assert out["bookkeeping_ms"] == 21.0 and out["bookkeeping_max_ms"] == 20.0
    assert out["longest"] == {"read_index": 1, "ms": 35.0, "num_chunks": 1, "forward_ms": 4.0,
                              "sync_ms": 30.0, "bookkeeping_ms": 1.0, "gc_ms": 0.5,
                              "cpu_ms": 3.5}
    assert out["longest_bookkeeping"]["ms"] == 30.0
    assert out["longest_bookkeeping"]["read_index"] == 0
    assert read_syncs.parts([])["longest"] is None


def test_a_sync_site_is_the_innermost_frames_of_this_repository():
    here = traceback.extract_stack()
    site = read_syncs.sync_site(here, depth=1)
    assert site.startswith("tests/unit/test_read_syncs.py:") and site.endswith(
        "test_a_sync_site_is_the_innermost_frames_of_this_repository")
    outside = [traceback.FrameSummary("/usr/lib/python3/x.py", 3, "f")]
    assert read_syncs.sync_site(outside) == "(outside the repository)"


def test_the_agents_are_followed_to_their_last_whole_chunk(tiny, tmp_path):
    """Two agents, turn by turn with outputs: every chunk due read in read_batch calls, each
    session left with less than a chunk, and the disk folder given the entries past the cap."""
    rng = random.Random(3)
    scripts = [AgentScript(f"a{i}", tuple(vocab_ids(rng, 150 + 40 * i)),
                           tuple(tuple(vocab_ids(rng, 90)) for _ in range(4)))
               for i in range(2)]
    reader = Reader(tiny, grid=G, max_checkpoints=1, disk_dir=tmp_path)
    args = argparse.Namespace(seed=0, output_ids=20, batch=4)
    results, syncs = read_syncs.follow(reader, scripts, args, audit=False)
    assert not syncs and all(r.num_chunks >= 1 for r in results)
    for s in scripts:
        assert 0 <= reader.backlog(s.name) < G
        assert reader.committed(s.name) == G * sum(s.name in r.sessions for r in results)
    assert len(reader.ids("a0")) == 150 + 4 * 90 + 5 * 20 + 4      # prompts, outputs, ends
    assert read_syncs.parts(results)["num_chunks"] == sum(r.num_chunks for r in results)
    reader.close()


def test_the_profile_keeps_the_read_with_the_longest_bookkeeping():
    """Each read wrapped runs under a profiler; the one kept is the one with the longest
    bookkeeping (not the longest read), and its functions name the work it did."""
    def spin(ms: float) -> None:
        import time
        end = time.perf_counter() + ms / 1e3
        while time.perf_counter() < end:
            pass

    def read(bookkeeping: float, forward: float) -> ReadResult:
        spin(bookkeeping)
        return ReadResult(64, 1, bookkeeping + forward + 1.0, sync_ms=1.0, forward_ms=forward)
    prof = read_syncs.LongestProfile()
    wrapped = prof.wrap(read)
    wrapped(2.0, 50.0)
    kept = wrapped(20.0, 1.0)
    wrapped(5.0, 0.0)
    top = prof.top(num_functions=5)
    assert top["read_index"] == 1 and top["bookkeeping_ms"] == pytest.approx(20.0)
    assert read_syncs.bookkeeping_ms(kept) == 20.0
    spun = next(f for f in top["functions"] if f["fn"].endswith(" spin"))
    assert spun["fn"].startswith("tests/unit/test_read_syncs.py:") and spun["num_calls"] == 1
    assert 15.0 <= spun["cumtime_ms"] and len(top["functions"]) <= 5
    assert read_syncs.LongestProfile().top() == {"read_index": None, "bookkeeping_ms": None,
                                                 "functions": []}


def test_the_old_arm_copies_in_the_reading_thread_and_the_spill_gets_its_own_back():
    from block_store import spill
    own = spill.copy_off
    with read_syncs.copies_made("disk_sync_copies"):
        assert spill.copy_off is read_syncs.sync_copy_off
        x = torch.ones(4)
        (same,), ready = spill.copy_off([x])
        assert same is x and ready is None
        (copied,), _ = spill.copy_off([x], always_copy=True)
        assert copied is not x and torch.equal(copied, x)
        pool = torch.arange(24.0).view(2, 3, 4)          # a page's rows, as spill.page_rows
        (rows,), _ = spill.copy_off([pool[:, 1]], always_copy=True, freed=False)
        assert torch.equal(rows, pool[:, 1])
    assert spill.copy_off is own
    with read_syncs.copies_made("disk"):
        assert spill.copy_off is own


def test_a_case_not_known_is_refused_before_the_model_loads(capsys):
    with pytest.raises(SystemExit):
        read_syncs.main(["--cases", "disk,disc", "--model", "random:no-such-model"])
    assert "'disc' is not one of disk, no_disk, disk_sync_copies" in capsys.readouterr().err


def test_without_the_audit_a_call_runs_as_it_is_and_counts_nothing():
    syncs = collections.Counter()
    assert read_syncs.audited(False, "read", syncs, lambda a, b: a + b, 2, 3) == 5
    assert not syncs
