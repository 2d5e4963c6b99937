"""The disk tier under the reader (issue 16, item 6): pages and GDN entries spilled by key and
found by key, by this reader after eviction and by another process sharing the folder;
manifests at a turn's start and end; the disk counters."""
import random

from helpers import disk_reader, rand_ids  # noqa: E402

from shadow_plugin.scheduling.host import Host
from shadow_plugin.scheduling.scheduler import SchedulerConfig

G = 64


def test_a_session_evicted_from_memory_comes_back_from_disk(tiny, tmp_path):
    """Parked, then its cached pages and entries forgotten (as when others reuse them): the
    restore loads them from disk, counted under the disk tier, bit for bit."""
    rng = random.Random(2)
    r = disk_reader(tiny, tmp_path, G)
    r.feed("a", rand_ids(5 * G + 7, rng), "prompt")
    r.read("a")
    before = {k: v.clone() for k, v in r.state_tensors("a").items()}
    table = r.table
    table.park("a")
    assert table.store.manager.forget_cached() == 5
    table.store.gdn.evict(0)
    hits = r.stats()["prefix_cache_hit_tokens"]
    after = r.state_tensors("a")
    assert all(before[k].equal(after[k]) for k in before)
    got = r.stats()["prefix_cache_hit_tokens"]
    assert got["disk"] - hits["disk"] == 5 * G and got["memory"] == hits["memory"]


def test_a_prompt_is_on_disk_before_the_feed_returns(tiny, tmp_path):
    """A turn's start writes the manifest: a reader started on the folder while the first
    still runs (as after a kill -9) knows the prompt's ids and resumes at the deepest line
    whose pages and states the disk holds (here the line written when it was last parked)."""
    rng = random.Random(3)
    first = disk_reader(tiny, tmp_path, G)
    first.feed("a", rand_ids(3 * G + 5, rng), "prompt")
    first.read("a")
    first.table.park("a")       # pages [0, 3 G) on disk
    prompt = first.ids("a") + rand_ids(2 * G, rng)
    first.feed("a", prompt, "prompt")
    first.read("a")                                  # read on, not parked: only in memory
    after_crash = disk_reader(tiny, tmp_path, G)
    assert after_crash.ids("a") == prompt and after_crash.committed("a") == 3 * G
    after_crash.read("a")
    assert after_crash.check_exact("a")


def test_a_turns_end_writes_the_manifest_with_the_hosts_output(tiny, tmp_path):
    r = disk_reader(tiny, tmp_path, G)
    host = Host(r, host_busy=lambda: True, cfg=SchedulerConfig(grid=G))
    rng = random.Random(4)
    prompt = rand_ids(2 * G, rng)
    host.turn_started("a", prompt)
    out = rand_ids(20, rng)
    host.output("a", out)
    host.turn_finished("a")
    assert disk_reader(tiny, tmp_path, G).ids("a") == prompt + out
