"""Pages shared between sessions, restored in another process (issue 16's exactness target):
many sessions that share a prefix cut on and off the grid and diverge, with rewrites, parks,
evictions of GDN entries and of cached pages under a small resident cap, then a planned stop;
a new process on the same folder holds every session's ids and C, continues each, and every
committed state equals a fresh prefill there bit for bit."""
import json
import random
import subprocess
import sys

import pytest
from helpers import rand_ids  # noqa: E402

from shadow_plugin.reader.reader import Reader

G = 64

SECOND = """
import json, sys
from adapters.model import load_model
from shadow_plugin.reader.reader import Reader
r = Reader(load_model("random:tiny"), grid=64, max_checkpoints=2, disk_dir=sys.argv[1],
           resident_bytes=600_000)
out = {}
for s, (ids, c) in json.loads(sys.argv[2]).items():
    held = [r.ids(s) == ids, r.committed(s) == c]
    r.feed(s, ids + [1000 + 7 * i for i in range(70)], "prompt")   # one more chunk, at least
    r.read(s)
    out[s] = held + [r.committed(s) > c, r.check_exact(s)]
print(json.dumps(out))
"""


def _history(reader: Reader, rng: random.Random, num_sessions: int) -> list[str]:
    """num_sessions sessions on one prefix (cut at k G, k G - 1, k G + 1, ...), each read,
    then three random steps on random sessions after each new one."""
    prefix, names = rand_ids(5 * G, rng), []
    for i in range(num_sessions):
        names.append(f"s{i}")
        cut = rng.choice([0, G - 1, G, G + 1, 2 * G + 30, 5 * G])
        reader.feed(names[-1], prefix[:cut] + rand_ids(rng.randrange(1, 150), rng), "prompt")
        reader.read(names[-1])
        for _ in range(3):
            sid, step = rng.choice(names), rng.choice(
                ["rewrite", "append", "evict_gdn", "evict_pages", "park"])
            held = reader.ids(sid)
            if step == "rewrite":
                reader.feed(sid, held[:rng.randrange(len(held) + 1)] + rand_ids(40, rng), "prompt")
            elif step == "append":
                reader.feed(sid, held + rand_ids(rng.randrange(1, 150), rng), "prompt")
            elif step == "evict_gdn":
                reader.table.store.gdn.evict(0)
            elif step == "evict_pages":
                reader.table.store.manager.forget_cached()
            elif sid in reader.table.resident:
                reader.table.park(sid)
            reader.read(sid)
    return names


@pytest.mark.parametrize("seed", [3, 4])
def test_sharing_sessions_restored_in_a_new_process_stay_exact(tiny, tmp_path, seed):
    reader = Reader(tiny, grid=G, max_checkpoints=2, disk_dir=tmp_path, resident_bytes=600_000)
    names = _history(reader, random.Random(seed), 6)
    held = {s: (reader.ids(s), reader.committed(s)) for s in names}
    assert all(reader.check_exact(s) for s in names)
    assert sum(c for _, c in held.values()) > 6 * G          # real state to restore
    reader.close()
    out = subprocess.run([sys.executable, "-c", SECOND, str(tmp_path), json.dumps(held)],
                         capture_output=True, text=True, check=True, timeout=600)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {s: [True, True, True, True] for s in names}
