"""Sessions restored in a new process continue exactly; a writer killed mid-write leaves a
loadable file."""
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import output_session, parking_reader

G = 64


RESTORE_SCRIPT = """
import json, sys
from adapters.model import load_model
from shadow_plugin.reader.reader import Reader
r = Reader(load_model("random:tiny"), grid=64, resident_bytes=0, disk_dir=sys.argv[1])
ids = r.ids("s")
r.feed("s", ids + list(range(1000, 1200)), "prompt")
r.read("s")
print(json.dumps({"committed": r.committed("s"), "exact": r.check_exact("s"),
                  "restores": r.stats()["restores"]}))
"""


def test_restore_in_a_new_process_continues_exactly(tiny, tmp_path):
    r = parking_reader(tiny, tmp_path)
    output_session(r, "s")
    r.close()
    out = subprocess.run([sys.executable, "-c", RESTORE_SCRIPT, str(tmp_path)],
                         capture_output=True, text=True, check=True, timeout=300)
    res = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert res == {"committed": 512, "exact": True, "restores": 1}


WRITER_SCRIPT = """
import random, sys
from adapters.model import load_model
from shadow_plugin.reader.reader import Reader
r = Reader(load_model("random:tiny"), grid=64, resident_bytes=10**12,
           disk_dir=sys.argv[1])
rng = random.Random(1)
r.feed("s", r.ids("s") + [rng.randrange(248000) for _ in range(700)], "prompt")
r.read("s")
print("ready", flush=True)
while True:
    r.table.park("s")      # write, then bring back, forever
    r.table.get("s")
"""


@pytest.mark.parametrize("delay_s", [0.05, 0.2, 0.5])
def test_writer_killed_mid_write_leaves_a_loadable_file(tiny, tmp_path, delay_s):
    r = parking_reader(tiny, tmp_path)
    output_session(r, "s")
    r.close()                                 # the previous good file
    proc = subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(delay_s)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    fresh = parking_reader(tiny, tmp_path)           # removes stale temporary files
    assert not list(tmp_path.rglob(".*.tmp"))
    assert fresh.check_exact("s") and fresh.committed("s") in (320, 1024)
    assert fresh.stats()["refusals"] == 0
