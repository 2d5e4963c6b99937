"""The evals scripts that run on the CPU, as a smoke test (their figures are for the device):
they run against the packages as they are now, and their checks hold."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, timeout: int = 600) -> dict:
    out = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_store_bench_spills_restores_and_a_second_process_reads_on(tmp_path):
    ids = tmp_path / "example.npz"
    subprocess.run([sys.executable, "-m", "evals.session_ids", "examples/session.json", "-o",
                    str(tmp_path)], cwd=ROOT, check=True, capture_output=True, timeout=300)
    (tmp_path / "session.npz").rename(ids)
    res = _run("evals.store_bench", "--ids", str(ids), "--more", str(ids), "--disk",
               str(tmp_path / "disk"), "--model", "random:tiny", "--device", "cpu",
               "--sizes", "1024,2048")
    assert [r["num_ids"] for r in res["sizes"]] == [1024, 2048]
    assert all(r["bitwise"] and r["file_bytes"] > 0 for r in res["sizes"])
    assert res["exact"] is True and res["second_process_exact"] is True
    assert res["second_process_restores"] == 1 and res["second_process_committed"] >= 2048


def test_pages_ab_drives_two_trees_in_turns(tmp_path):
    """The interleaved A/B (here the same tree twice): every measurement taken from both
    workers in turns, both exact, the same path."""
    subprocess.run([sys.executable, "-m", "evals.session_ids", "examples/session.json", "-o",
                    str(tmp_path)], cwd=ROOT, check=True, capture_output=True, timeout=300)
    res = _run("evals.pages_ab", "--a", ".", "--b", ".", "--ids", str(tmp_path / "session.npz"),
               "--model", "random:tiny", "--device", "cpu", "--grid", "64", "--max-context",
               "1024", "--points", "256", "--ask-at", "700", "--chunks", "2", "--repeats", "2",
               "--decode", "2")["results"]
    assert len(res["chunk_0k"]["a_all"]) == len(res["chunk_0k"]["b_all"]) == 2
    assert len(res["ask_0k"]["a_all"]) == 2 and res["decode"]["a_ms"] > 0
    assert res["exact"]["a"] == res["exact"]["b"] == {"exact": True, "path": "eager"}
