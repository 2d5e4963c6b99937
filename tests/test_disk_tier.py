"""The disk tier under the reader (issue 16, item 6): pages and GDN entries spilled by key and
found by key, by this reader after eviction and by another process sharing the folder;
manifests at a turn's start and end; the disk counters."""
import json
import random
import subprocess
import sys

from shadow_plugin.host import Host
from shadow_plugin.reader import Reader
from shadow_plugin.scheduler import SchedulerConfig

G = 64


def _rand(n, rng):
    return [rng.randrange(1000, 240000) for _ in range(n)]


def _reader(tiny, disk, **kw):
    return Reader(tiny, grid=G, max_checkpoints=2, disk_dir=disk, **kw)


SECOND = """
import json, sys
from adapters.model import load_model
from shadow_plugin.reader import Reader
r = Reader(load_model("random:tiny"), grid=64, max_checkpoints=2, disk_dir=sys.argv[1])
ids = json.loads(sys.argv[2])
r.feed("other", ids, "prompt")
s = r.stats()
out = {"committed": r.committed("other"), "disk_hits": s["prefix_cache_hit_tokens"]["disk"],
       "read_before": s["read_tokens"]}
r.read("other")
out["exact"] = r.check_exact("other")
print(json.dumps(out))
"""


def test_another_process_finds_the_pages_by_key_and_stays_exact(tiny, tmp_path):
    """The first reader parks a session whose prompt has a checkpoint at 3 G; a second
    process starts another session with the same 3 G + 10 ids then its own: it resumes at 3 G
    from the first's files without reading them, and is exact."""
    rng = random.Random(1)
    prefix = _rand(3 * G, rng)
    first = _reader(tiny, tmp_path)
    first.feed("a", prefix + _rand(5, rng), "prompt")      # the prompt line at 3 G
    first.read("a")
    first.feed("a", first.ids("a") + _rand(4 * G, rng), "prompt")
    first.read("a")
    assert 3 * G in first.checkpoint_positions("a")
    first.close()
    s = first.stats()
    assert s["pages"]["disk"] == 7 and s["sessions"]["a"]["committed"] == 7 * G
    assert s["gdn_entries"]["disk"] >= 2 and s["disk_bytes"] > 0
    ids = prefix + _rand(10 + 2 * G, rng)
    out = subprocess.run([sys.executable, "-c", SECOND, str(tmp_path), json.dumps(ids)],
                         capture_output=True, text=True, check=True, timeout=300)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"committed": 3 * G, "disk_hits": 3 * G, "read_before": 0, "exact": True}


def test_a_session_evicted_from_memory_comes_back_from_disk(tiny, tmp_path):
    """Parked, then its cached pages and entries forgotten (as when others reuse them): the
    restore loads them from disk, counted under the disk tier, bit for bit."""
    rng = random.Random(2)
    r = _reader(tiny, tmp_path)
    r.feed("a", _rand(5 * G + 7, rng), "prompt")
    r.read("a")
    before = {k: v.clone() for k, v in r.state_tensors("a").items()}
    table = r.table
    table.residency.park(table.resident, "a")
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
    first = _reader(tiny, tmp_path)
    first.feed("a", _rand(3 * G + 5, rng), "prompt")
    first.read("a")
    first.table.residency.park(first.table.resident, "a")       # pages [0, 3 G) on disk
    prompt = first.ids("a") + _rand(2 * G, rng)
    first.feed("a", prompt, "prompt")
    first.read("a")                                  # read on, not parked: only in memory
    after_crash = _reader(tiny, tmp_path)
    assert after_crash.ids("a") == prompt and after_crash.committed("a") == 3 * G
    after_crash.read("a")
    assert after_crash.check_exact("a")


def test_a_turns_end_writes_the_manifest_with_the_hosts_output(tiny, tmp_path):
    r = _reader(tiny, tmp_path)
    host = Host(r, host_busy=lambda: True, cfg=SchedulerConfig(grid=G))
    rng = random.Random(4)
    prompt = _rand(2 * G, rng)
    host.turn_started("a", prompt)
    out = _rand(20, rng)
    host.output("a", out)
    host.turn_finished("a")
    assert _reader(tiny, tmp_path).ids("a") == prompt + out
