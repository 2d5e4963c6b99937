"""The evals scripts that run on the CPU, as a smoke test (their figures are for the device):
they run against the packages as they are now, and their checks hold."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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
    assert all(r["bitwise"] and r["disk_bytes"] > 0 and r["respill_ms"] > 0 and
               r["restored_from_disk_tokens"] == r["num_ids"] for r in res["sizes"])
    assert res["exact"] is True and res["second_process_exact"] is True
    assert res["second_process_restores"] == 1 and res["second_process_committed"] >= 2048
    c = (2048 + 4096) // 512 * 512                       # what the first process spilled last
    assert res["second_process_new_session_resumed_at"] == c
    assert res["second_process_disk_hit_tokens"] == c
    assert res["second_process_new_session_exact"] is True


def test_move_restores_on_the_second_server_and_reads_no_more_than_staying():
    """evals.move at grid 64: a random session and the example agent session move from server
    A to server B over one shared folder; B restores each once from the folder, resumes at A's
    C (the random one) and reads no more than a page beyond staying on A (the recorded one,
    against its control run), exact."""
    res = _run("evals.move", "--sizes", "256", "--grid", "64", "--output-ids", "20",
               "--new-ids", "40", "--sessions", "examples/session.json", "--stay")
    rnd, rec = res["moves"]
    assert rnd["a"]["committed"] == rnd["b"]["resumed_at"] == 256 and rnd["below_a"] == 0
    assert rnd["b"]["num_read_tokens"] == rnd["stay_reads"] == 320 - 256
    assert rnd["b"]["num_reread_tokens"] == 0 and rnd["a"]["hint"]["warm_tokens"] == 256
    for m in (rnd, rec):
        assert m["b"]["num_restores"] == 1 and m["b"]["restore_ms"] > 0
        assert m["b"]["exact"] is True
    assert rec["b"]["committed"] == rec["stay"]["committed"]
    assert rec["b"]["num_read_tokens"] <= rec["stay"]["num_read_tokens"] + 64
    assert len(res["identity"]) == 32 and res["date"]


@pytest.mark.parametrize("questions", [True, False])
def test_reread_checks_every_rewrite_against_its_bound(questions):
    """With the router question after every turn (replay's way, issue 33) and without: every
    rewrite within its bound, at most a page read again below its first difference; without
    questions a BPE-boundary rewrite re-reads at most one page."""
    res = _run("evals.reread", "examples/session.json", "--model", "random:tiny", "--device",
               "cpu", "--grid", "64", "--check-exact", *([] if questions else ["--no-questions"]))
    (name, s), = res["sessions"].items()
    assert res["questions"] is questions
    assert s["exact"] is True and s["turns"] > 0 and s["committed"] > 0
    assert res["num_over_bound"] == 0 == s["num_over_bound_bpe"] == s["num_over_bound_template"]
    assert s["max_reread_below_difference"] <= 64
    assert s["read_per_held"] >= 1 and s["gdn_entries_held"] > 0
    if not questions:
        assert s["max_reread_bpe"] <= 64


def _prefix_file() -> Path:
    """opencode's prefix in the shared data set (evals.data.data_dir); without it the test
    skips, or fails under CI=true (where the data set must be present)."""
    from evals.data import data_dir
    path = data_dir() / "prefixes" / "opencode_qwen.json"
    if not path.is_file():
        why = f"{path} is absent (the shared data set: $SHADOW_DATA_DIR or ../shared/data)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {why}")
        pytest.skip(why)
    return path


def test_prefix_hits_shares_an_agents_prefix_and_plots_it(tmp_path):
    """Two sessions of one agent (the example and a copy with another first request), with
    opencode's prefix: the second reads less together than alone, within its bound; the plot
    is written."""
    prefix = _prefix_file()
    raw = json.loads((ROOT / "examples" / "session.json").read_text())
    other = json.loads(json.dumps(raw))
    first_user = next(m for m in other["messages"] if m["role"] == "user")
    first_user["content"] = "A different request: " + str(first_user["content"])
    paths = []
    for name, data in (("a", raw), ("b", other)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(data))
    png = tmp_path / "hits.png"
    out = subprocess.run([sys.executable, "-m", "evals.cli", "prefix-hits", *map(str, paths),
                          "--prefix", str(prefix),
                          "--grid", "64", "--plot", str(png)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    b = res["sessions"]["b"]
    assert res["target_met"] and res["prefix_held_once"] and b["shared_whole_pages"] > 0
    assert b["read_together"] < b["read_alone"] and b["exact"] is True
    assert 0 < res["prefix_cache_hit_rate"] <= 1 and png.stat().st_size > 1000
