"""Two processes writing and sweeping one disk folder under a small cap, one of them killed
with SIGKILL at seeded moments and started again: every session each serves is exact after
every turn (nothing served from a torn or foreign file), and a fresh reader on the folder
afterwards refuses nothing and serves every session exactly."""
import json
import os
import random
import signal
import subprocess
import sys
import time

from helpers import disk_reader

G = 64
CAP_BYTES = 700_000        # about six pages and two GDN entries of random:tiny
NUM_TURNS = 8              # each worker's turns in its last run

WORKER = """
import json, random, sys
from adapters.model import load_model
from shadow_plugin.reader.reader import Reader
disk, name, seed, num_turns = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
r = Reader(load_model("random:tiny"), grid=64, max_checkpoints=2, resident_bytes=0,
           disk_dir=disk, disk_bytes=int(sys.argv[5]), disk_shared=True, disk_grace_s=0.3)
rng = random.Random(seed)
shared = random.Random(7).sample(range(1000, 240000), 150)   # a prefix both share, by key
print("ready", flush=True)
for turn in range(num_turns):
    sid = rng.choice([f"{name}-0", f"{name}-1", "both"])      # "both": fed by the two
    held = r.ids(sid) if r.knows(sid) else []
    fresh = not held or len(held) > 450
    prompt = (shared if fresh else held) + [rng.randrange(1000, 240000)
                                            for _ in range(rng.randrange(30, 160))]
    r.feed(sid, prompt, "prompt")
    r.read(sid)
    assert r.check_exact(sid), (name, turn, sid)               # raises ExactnessError
    print(json.dumps({"turn": turn, "session": sid, "committed": r.committed(sid)}),
          flush=True)
s = r.stats()
print(json.dumps({"done": name, "refusals": s["refusal_reasons"],
                  "deleted_files": s["deleted_files"], "superseded": s["superseded"]}),
      flush=True)
"""


def _worker(disk, name, seed, num_turns):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(disk), name, str(seed),
                             str(num_turns), str(CAP_BYTES)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline().strip()
    assert line == "ready", (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc


def test_two_processes_sweeping_one_folder_with_kills_serve_only_exact_sessions(tiny, tmp_path):
    rng = random.Random(37)
    disk = tmp_path / "disk"
    procs = {"a": _worker(disk, "a", 1, 10_000), "b": _worker(disk, "b", 2, NUM_TURNS)}
    try:
        for kill in range(2):                 # a seeded kill -9 of "a" mid-work, then again
            time.sleep(rng.uniform(0.5, 3.0))
            procs["a"].send_signal(signal.SIGKILL)
            out, err = procs["a"].communicate(timeout=30)
            assert procs["a"].returncode == -signal.SIGKILL, err[-3000:]
            assert "Error" not in err, err[-3000:]
            procs["a"] = _worker(disk, "a", 10 + kill, NUM_TURNS if kill else 10_000)
        done = {}
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err[-3000:]
            done[name] = json.loads(out.strip().splitlines()[-1])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert all(d["refusals"] == {} for d in done.values()), done
    assert sum(d["deleted_files"] for d in done.values()) > 0          # the cap swept
    fresh = disk_reader(tiny, disk, G, resident_bytes=0, disk_shared=True)
    assert not list(disk.rglob(".*.tmp"))          # the killed writers' temporaries removed
    sessions = fresh.sessions()
    assert {"a-0", "a-1", "b-0", "b-1", "both"} >= set(sessions) and "both" in sessions
    for sid in sessions:
        fresh.read(sid)
        assert fresh.check_exact(sid) and fresh.committed(sid) == len(fresh.ids(sid)) // G * G
    assert fresh.stats()["refusals"] == 0
