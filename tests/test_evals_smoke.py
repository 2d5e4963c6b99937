"""The evals scripts that run on the CPU, as a smoke test (their figures are for the device):
they run against the packages as they are now, and their checks hold."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert all(r["bitwise"] and r["disk_bytes"] > 0 and r["respill_ms"] > 0 and
               r["restored_from_disk_tokens"] == r["num_ids"] for r in res["sizes"])
    assert res["exact"] is True and res["second_process_exact"] is True
    assert res["second_process_restores"] == 1 and res["second_process_committed"] >= 2048
    c = (2048 + 4096) // 512 * 512                       # what the first process spilled last
    assert res["second_process_new_session_resumed_at"] == c
    assert res["second_process_disk_hit_tokens"] == c
    assert res["second_process_new_session_exact"] is True


def _pages_ab(tmp_path, *args) -> dict:
    """evals.pages_ab's results, the same tree twice on the example session's ids (random:tiny,
    grid 64, chunks at 256, bursts of 2), with `args` added."""
    subprocess.run([sys.executable, "-m", "evals.session_ids", "examples/session.json", "-o",
                    str(tmp_path)], cwd=ROOT, check=True, capture_output=True, timeout=300)
    return _run("evals.pages_ab", "--a", ".", "--b", ".", "--ids", str(tmp_path / "session.npz"),
                "--model", "random:tiny", "--device", "cpu", "--grid", "64", "--max-context",
                "1024", "--points", "256", "--chunks", "2", "--decode", "2", "--burst", "2",
                *args)["results"]


def test_pages_ab_drives_two_trees_in_turns(tmp_path):
    """The interleaved A/B (here the same tree twice): every measurement taken from both
    workers in turns, both exact, the same path."""
    res = _pages_ab(tmp_path, "--ask-at", "700", "--repeats", "2", "--bands", "0:128,256:448")
    for band in ("band_0_128", "band_256_448"):        # read rates: 2 rounds a tree
        assert len(res[band]["a_all"]) == len(res[band]["b_all"]) == 2
        assert res[band]["a_ms"] > 0 and res[band]["b_ms"] > 0
    assert len(res["chunk_0k"]["a_all"]) == len(res["chunk_0k"]["b_all"]) == 2
    bursts = res["burst_0k"]                   # 2 bursts of 2 chunks a tree
    assert bursts["burst"] == 2 and len(bursts["first_of_burst"]["b_all"]) == 2
    assert len(bursts["rest_of_burst"]["a_all"]) == 2 and bursts["rest_of_burst"]["a_ms"] > 0
    assert len(res["ask_0k"]["a_all"]) == 2 and res["decode"]["a_ms"] > 0
    assert res["exact"]["a"] == res["exact"]["b"] == {"exact": True, "path": "eager",
                                                      "small_bucket_rows": []}


def test_pages_ab_gives_one_tree_small_question_buckets(tmp_path):
    """--b-bucket-rows: B's worker reads through runners with those small question buckets (on
    the CPU their bodies without graphs), A's as the tree has them; both exact."""
    res = _pages_ab(tmp_path, "--ask-at", "700", "--repeats", "1", "--points", "",
                    "--b-bucket-rows", "128")
    assert res["exact"]["a"] == {"exact": True, "path": "eager", "small_bucket_rows": []}
    assert res["exact"]["b"] == {"exact": True, "path": "eager:sdpa",
                                 "small_bucket_rows": [128]}
    assert len(res["ask_0k"]["b_all"]) == 1 and res["ask_0k"]["b_ms"] > 0
    res = _pages_ab(tmp_path, "--ask-at", "", "--repeats", "1", "--points", "",
                    "--b-bucket-rows", "none")         # the runners without small buckets
    assert res["exact"]["b"] == {"exact": True, "path": "eager:sdpa", "small_bucket_rows": []}
    for tree in ("a", "b"):                 # load, construction and warm-up timed
        setup = res["setup"][tree]
        assert setup["load_s"] > 0 and setup["build_s"] > 0 and setup["warm_read_s"] > 0
        assert setup["warm_up_s"] >= 0 and setup["cuda_reserved_bytes"] == 0


def test_pages_ab_pairs_of_fresh_workers_give_ratios_across_pairs(tmp_path):
    """--pairs 2: two fresh pairs of workers (B's chunk first in the second), each with its own
    results, and per measurement the two ratios and their median."""
    res = _pages_ab(tmp_path, "--ask-at", "", "--repeats", "1", "--pairs", "2")
    assert len(res["pairs"]) == 2 and all(p["exact"]["b"]["exact"] for p in res["pairs"])
    across = res["across_pairs"]
    assert set(across) == {"chunk_0k", "burst_0k/first_of_burst", "burst_0k/rest_of_burst",
                           "decode"}
    for key, val in across.items():
        ratios = [p[key.split("/")[0]] for p in res["pairs"]]
        ratios = [r[key.split("/")[1]] if "/" in key else r for r in ratios]
        assert val["b_over_a"] == [r["b_over_a"] for r in ratios]
        assert min(val["b_over_a"]) <= val["median"] <= max(val["b_over_a"])


@pytest.mark.parametrize("args,why", [
    (["--burst", "1"], "--burst 0 or >= 2"), (["--chunks", "1"], "--chunks >= 2"),
    (["--pairs", "0"], "--pairs >= 1"),
    (["--points", "1024", "--burst", "3"], "read to 5120 ids: raise --max-context"),
    (["--bands", "0:100"], "bands 0:100: whole chunks of 512"),
    (["--bands", "0:204800"], "within --max-context"), (["--bands", "7"], "START:END"),
    (["--b-bucket-rows", "100"], "multiples of 64 below 256"),
    (["--a-bucket-rows", "128,64"], "ascending"), (["--b-bucket-rows", "x"], "row counts")])
def test_pages_ab_refuses_settings_it_cannot_measure(args, why, capsys):
    """Before any worker starts: a burst of one chunk (no chunk after the first), one chunk
    (only the warm-up), no pair, and chunks past the ids."""
    from evals.pages_ab import main
    with pytest.raises(SystemExit):
        main(["--a", ".", "--ids", "x.npz", "--max-context", "4096", "--grid", "512",
              "--chunks", "2", *args])
    assert why in capsys.readouterr().err


def test_reread_checks_every_rewrite_against_its_bound():
    res = _run("evals.reread", "examples/session.json", "--model", "random:tiny", "--device",
               "cpu", "--grid", "64", "--check-exact")
    (name, s), = res["sessions"].items()
    assert s["exact"] is True and s["turns"] > 0 and s["committed"] > 0
    assert res["num_over_bound"] == 0 == s["num_over_bound_bpe"] == s["num_over_bound_template"]
    assert s["max_reread_bpe"] <= 64


def test_disk_ab_times_both_variants_and_stays_exact(tmp_path):
    subprocess.run([sys.executable, "-m", "evals.session_ids", "examples/session.json", "-o",
                    str(tmp_path)], cwd=ROOT, check=True, capture_output=True, timeout=300)
    ids = str(tmp_path / "session.npz")
    res = _run("evals.disk_ab", "--ids", ids, "--more", ids, "--disk", str(tmp_path / "d"),
               "--model", "random:tiny", "--device", "cpu", "--size", "2048", "--repeats", "2",
               "--threads", "2")
    assert len(res["spill"]["all_ms"]) == 2
    assert all(len(res["restore"][v]["all_ms"]) == 2 for v in ("before", "after", "after_t2"))
    assert res["same_bits"] is True and res["exact"] is True and res["disk_bytes"] > 0


def test_prefix_hits_shares_an_agents_prefix_and_plots_it(tmp_path):
    """Two sessions of one agent (the example and a copy with another first request), with
    opencode's prefix: the second reads less together than alone, within its bound; the plot
    is written."""
    from evals.data import data_dir
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
                          "--prefix", str(data_dir() / "prefixes" / "opencode_qwen.json"),
                          "--grid", "64", "--plot", str(png)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    b = res["sessions"]["b"]
    assert res["target_met"] and res["prefix_held_once"] and b["shared_whole_pages"] > 0
    assert b["read_together"] < b["read_alone"] and b["exact"] is True
    assert 0 < res["prefix_cache_hit_rate"] <= 1 and png.stat().st_size > 1000


def test_kernel_profiles_compare_by_name_over_both_tables():
    """evals.kernel_profile.side_by_side: the union of both sides' kernels (one a side lacks
    counts 0), largest |B - A| first, at most `top` rows."""
    from evals.kernel_profile import short_name, side_by_side
    a = {"busy_ms": 1.0, "event_ms": 1.2, "num_kernels": 3,
         "kernels": {"gemm": [0.5, 2], "attn": [0.4, 1], "only_a": [0.1, 1]}}
    b = {"busy_ms": 1.3, "event_ms": 1.5, "num_kernels": 3,
         "kernels": {"gemm": [0.5, 2], "attn": [0.7, 1], "only_b": [0.2, 1]}}
    lines = side_by_side(a, b, width=10, top=3).splitlines()
    assert [line.split()[0] for line in lines[2:]] == ["attn", "only_b", "only_a"]
    assert lines[2].split()[1:4] == ["0.4000", "0.7000", "0.3000"]
    assert lines[4].split()[1:4] == ["0.1000", "0.0000", "-0.1000"]
    assert short_name("void k<int, 3>(float*, int)") == "void k<>"


def test_idle_gaps_sums_the_gpus_idle_time_by_the_kernel_after_it():
    """Kernels at [0, 10), [12, 20), [15, 30) (overlapping the one before), [40, 41) us: idle
    2 us before b (after a) and 10 us before the second a (after c, the latest end), none
    before c; per call with 2 calls."""
    from evals.kernel_profile import idle_gaps
    got = idle_gaps([(40, 41, "a"), (0, 10, "a"), (12, 20, "b"), (15, 30, "c")], calls=2)
    assert got["idle_ms"] == 0.006
    assert got["idle_before"] == {"a": 0.005, "b": 0.001}
    assert got["gaps_us"] == [[10, "c", "a"], [2, "a", "b"]]


def _ab_worker():
    """evals/ab_worker.py as a module (a script run by its path, imported the same way)."""
    sys.path.insert(0, str(ROOT / "evals"))
    try:
        import ab_worker
    finally:
        sys.path.remove(str(ROOT / "evals"))
    return ab_worker


def test_pages_ab_bands_share_no_page_and_refuse_a_resume(tiny):
    """evals/ab_worker.py's bands: each call's ids are its own, so a paged reader reads every
    repeat in full (on 2026-12-02 repeats resumed from the pages an earlier call left cached
    and timed nothing); a band session that would resume past its start is refused."""
    ab_worker = _ab_worker()
    from shadow_plugin import Reader
    reader, g = Reader(tiny, grid=64), 64
    ids = [(7 * i + 3) % 1000 + 10 for i in range(8 * g)]
    chunks = []
    timed = lambda fn: chunks.append(fn().num_chunks) or 1.0  # noqa: E731
    for k in range(3):                                   # three repeats of one band
        assert ab_worker._band(reader, ids, 2 * g, 6 * g, timed, g, k) == {
            "ms": 1.0, "ms_per_1k": 1000 / (4 * g)}
    assert chunks == [4, 4, 4] and reader.sessions() == []      # each dropped after its read
    name = ab_worker._band_session(reader, ids, 0, 4 * g, g, 7)
    reader.read(name)                                      # its pages and states now cached
    reader.drop(name)
    with pytest.raises(ab_worker.BandRefused, match=r"band \[128, 256\) started at 256"):
        ab_worker._band_session(reader, ids, 2 * g, 4 * g, g, 7)
    assert reader.sessions() == []                         # the refused session dropped too
    assert ab_worker._band(reader, ids, 2 * g, 4 * g, timed, g, 7)["error"].startswith(
        "band [128, 256) started at")
    assert "must be whole chunks" in ab_worker._band(reader, ids, 1, 4 * g, timed, g, 8)["error"]
    assert reader.sessions() == [] and chunks == [4, 4, 4]


def test_pages_ab_profiles_a_band_after_its_untraced_chunks(tiny, monkeypatch):
    """evals/ab_worker.py's profile_band: the traced call reads n chunks of a band session of
    its own, after n untraced ones (kernel_table calls fn once untraced), then drops it."""
    ab_worker = _ab_worker()
    from types import SimpleNamespace

    from shadow_plugin import Reader
    reader, g = Reader(tiny, grid=64), 64
    ids = [(5 * i + 1) % 1000 + 10 for i in range(8 * g)]

    def kernel_table(fn, calls):                 # as evals/kernel_profile.py: one untraced call
        return {"untraced": fn().num_chunks, "traced": [fn().num_chunks for _ in range(calls)]}
    monkeypatch.setattr(ab_worker, "_kernel_profile",
                        lambda: SimpleNamespace(kernel_table=kernel_table))
    assert ab_worker._profile_band(reader, ids, 2 * g, 8 * g, 2, g, 0) == {"untraced": 2,
                                                                          "traced": [2]}
    assert reader.sessions() == []
    assert "fewer than the 4 chunks" in ab_worker._profile_band(reader, ids, 6 * g, 8 * g, 2, g,
                                                                1)["error"]
    assert "must be whole chunks" in ab_worker._profile_band(reader, ids, 6 * g, 10 * g, 2, g,
                                                             2)["error"]
    assert reader.sessions() == []


@pytest.mark.parametrize("pos", [4096, 16384, 16384 + 192])
def test_fa4_graph_probe_tables_hold_the_runners_sub_pages(pos):
    """evals/fa4_graph_probe.Fixed.set: the fixed-width tables begin with the sub-pages of the
    runner's plan (fa4_plan.plan_into, same pages, same SM count), the key counts are the
    plan's split length and tail, and a position with another number of splits is refused."""
    import numpy as np
    import torch

    from adapters.model import fa4_plan
    from evals.fa4_graph_probe import HKV, Fixed, G, H, T
    num_sms, dev = 132, torch.device("cpu")
    pages = list(np.random.default_rng(pos).permutation(80))
    fixed = Fixed(4, 32768 + T, num_sms, dev, torch.bfloat16)
    q = torch.randn(T, H, 256).to(torch.bfloat16)
    fixed.set(q, pos, pages)
    host = np.zeros(fa4_plan.plan_size(pos + T, G), dtype=np.int32)
    plan, _ = fa4_plan.plan_into(pos, T, (H, HKV), num_sms, np.asarray(pages), G, host,
                                 torch.from_numpy(host))
    s, ls = plan.splits
    assert s == 4 and fixed.split_len.tolist() == [ls] * 4
    assert torch.equal(fixed.split_tab[:, :ls // 64], plan.split)
    assert not fixed.split_tab[:, ls // 64:].any()
    assert fixed.tail_len.tolist() == [pos + T - 4 * ls]
    assert torch.equal(fixed.tail_tab[:, :plan.tail.shape[1]], plan.tail)
    assert torch.equal(fixed.q, q)
    with pytest.raises(ValueError, match="has 2 splits, the capture 4"):
        fixed.set(q, 2048, pages)
