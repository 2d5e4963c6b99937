"""A second process on the same disk folder finds the first's pages by key and stays exact."""
import json
import random
import subprocess
import sys

from helpers import disk_reader, rand_ids  # noqa: E402

G = 64


SECOND = """
import json, sys
from adapters.model import load_model
from shadow_plugin.reader.reader import Reader
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
    prefix = rand_ids(3 * G, rng)
    first = disk_reader(tiny, tmp_path, G)
    first.feed("a", prefix + rand_ids(5, rng), "prompt")      # the prompt line at 3 G
    first.read("a")
    first.feed("a", first.ids("a") + rand_ids(4 * G, rng), "prompt")
    first.read("a")
    assert 3 * G in first.checkpoint_positions("a")
    first.close()
    s = first.stats()
    assert s["pages"]["disk"] == 7 and s["sessions"]["a"]["committed"] == 7 * G
    assert s["gdn_entries"]["disk"] >= 2 and s["disk_bytes"] > 0
    ids = prefix + rand_ids(10 + 2 * G, rng)
    out = subprocess.run([sys.executable, "-c", SECOND, str(tmp_path), json.dumps(ids)],
                         capture_output=True, text=True, check=True, timeout=300)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"committed": 3 * G, "disk_hits": 3 * G, "read_before": 0, "exact": True}
