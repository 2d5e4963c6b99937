"""The read benchmark runs on the CPU with random:tiny (a smoke test: its figures are for the
device; here only their presence and the exactness after the timed runs are checked)."""
import json
from pathlib import Path

import pytest

from evals.cli import main

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "session.json")


def test_bench_smoke(capsys):
    assert main(["bench", "--model", "random:tiny", "--device", "cpu", "--max-context", "2048",
                 "--grids", "512,1024", "--ask-at", "1024", "--ids", EXAMPLE,
                 "--parts", "read,exact,decode,ask,floor,grids"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for grid in (512, 1024):
        part = res[f"read_grid{grid}"]
        assert part["exact_after_timed_runs"] is True and part["ms_per_1k"]["0k-8k"] > 0
        backlog = part["ms_per_1k_backlog"]               # the same ids read as one backlog
        assert set(backlog) == {"0k-8k", "0k-32k"} and backlog["0k-32k"] == backlog["0k-8k"] > 0
    assert res["read_grid512"]["decode_ms_per_token"] > 0
    assert set(res["ask_ms"]) == {"1k"} and res["gemm_floor_ms_per_chunk"] > 0
    assert res["grid_512_vs_2048"]["questions"] == 8
    assert res["gpu"] == "cpu" and res["date"]


def test_bench_refuses_bad_grids_context_and_files(capsys, tmp_path):
    """Bad grids, a context below the grid and a file that is not a session are refused before
    anything runs, with a message naming them (exit 2)."""
    base = ["bench", "--model", "random:tiny", "--device", "cpu", "--ids", EXAMPLE]
    assert main(base + ["--grids", "500"]) == 2
    assert "--grids must be positive multiples of 64" in capsys.readouterr().err
    assert main(base + ["--max-context", "0"]) == 2
    assert "--max-context at least the largest" in capsys.readouterr().err
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    assert main(["bench", "--model", "random:tiny", "--device", "cpu", "--ids", str(empty),
                 "--max-context", "512", "--grids", "512"]) == 2
    assert f"{empty}: not a session" in capsys.readouterr().err
    for extra in (["--attention", "fa4"], ["--attn-tiling", "0x0x0x0"]):     # eager on the CPU
        assert main(base + ["--max-context", "512", "--grids", "512"] + extra) == 2
        assert "choose the CUDA-graph runners' attention" in capsys.readouterr().err
    assert main(base + ["--attention", "fa4", "--attn-tiling", "128x32x8x2"]) == 2
    assert "--attn-tiling is the table attention's" in capsys.readouterr().err
    assert main(base + ["--out", str(tmp_path / "missing" / "r.json")]) == 2
    assert "--out" in capsys.readouterr().err



def test_batch_bench_smoke(capsys):
    """evals.batch_bench on the CPU: questions in one forward and batched reads, every answer
    and state exact (its timings are for the device; only their presence is checked)."""
    from evals import batch_bench
    assert batch_bench.main(["--grid", "64", "--contexts", "128", "--batches", "1,2",
                             "--repeats", "1", "--questions", "2", "--tail", "10"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ask = res["ask"]["128"]
    assert ask["exact"] is True and ask["batched"] is True and ask["committed"] == 128
    assert ask["2_in_one_forward_ms"] > 0 and ask["2_one_at_a_time_ms"] > 0
    assert len(ask["each_ms"]) == 2 and all(ms > 0 for ms in ask["each_ms"])
    assert ask["question_batches_an_ask"] == 0 and ask["warm_up_s"] >= 0   # the eager adapter
    assert "profile" not in ask                                              # (no graphs)
    assert batch_bench.main(["--grid", "64", "--contexts", "128", "--repeats", "1",
                             "--questions", "2", "--tail", "10", "--parts", "ask",
                             "--profile"]) == 0
    prof = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["ask"]["128"]["profile"]
    assert any("ask_many" in name and calls == 1 and ms > 0 for name, calls, ms in prof)
    assert [res["read"][f"128x{b}"]["exact"] for b in (1, 2)] == [True, True]
    assert res["read"]["128x2"]["ids_per_s_one_forward"] > 0 and res["date"]
    assert res["gpu"] == "none" and res["dtype"] in ("float32", "bfloat16")


def test_tail_bench_smoke(capsys):
    """evals.tail_bench on the CPU (random:tiny, grid 256): every arm timed, the kept and the
    unkept tail's logits equal, the answers equal, the kept question forwarding fewer ids;
    tails and contexts it cannot measure refused, naming the flag."""
    from evals import tail_bench
    res = tail_bench.main(["--model", "random:tiny", "--device", "cpu", "--grid", "256",
                           "--contexts", "256", "--tails", "200", "--repeats", "1",
                           "--threads", "1"])
    run = res["runs"][0]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["runs"][0] == run
    assert run["answers_equal"] and run["kept_equals_unkept_forward"] and run["tail_hits"] >= 1
    assert run["forwarded_kept"] == 456 - 448 + run["question_ids"]      # cut at 448
    assert run["forwarded_none"] == 200 + run["question_ids"]
    assert all(ms > 0 for ms in run["ms"].values())
    for bad, flag in ((["--tails", "30"], "--tails"), (["--contexts", "300"], "--contexts")):
        with pytest.raises(SystemExit):
            tail_bench.main(["--device", "cpu", "--grid", "256", *bad])
        assert flag in capsys.readouterr().err


def _event(name, start, end, device="CPU", annotation=False):
    from types import SimpleNamespace
    return SimpleNamespace(name=name, device_type=f"DeviceType.{device}",
                           time_range=SimpleNamespace(start=start, end=end),
                           is_user_annotation=annotation)


def test_device_timeline_charges_idle_device_time_to_the_ops_the_host_ran():
    """evals.timing's split of a profile: two calls (windows 0-100 and 200-260 us), kernels
    over 10-40 and 30-50 (merged) and 220-260; the idle pieces of each window charged to the
    innermost op or runtime call running over them ("-": none, Python); gaps shorter than
    min_gap_us left out. The device's copies of the calls' ranges (CUDA annotations spanning
    their first to last kernel) are neither calls nor kernels (a review found them hiding the
    idle time between kernels)."""
    from evals import timing
    events = [
        _event("device_timeline.call", 0, 100), _event("device_timeline.call", 200, 260),
        _event("device_timeline.call", 10, 50, "CUDA", annotation=True),
        _event("device_timeline.call", 220, 260, "CUDA", annotation=True),
        _event("Torch-Compiled Region", 10, 260, "CUDA", annotation=True),
        _event("k1", 10, 40, "CUDA"), _event("k2", 30, 50, "CUDA"), _event("k1", 220, 260, "CUDA"),
        _event("aten::empty", 0, 5),
        _event("aten::to", 55, 75), _event("aten::copy_", 55, 70),     # nested: copy_ inside
        _event("cudaGraphLaunch", 203, 210),
    ]
    windows, busy, kernels, gaps = timing._split(events, min_gap_us=5)
    assert windows == [(0, 100), (200, 260)] and busy == [(10, 50), (220, 260)]
    assert kernels == {"k1": (2, 70), "k2": (1, 20)}
    assert gaps == [(5, "aten::empty"), (5, "-"),
                    (5, "-"), (15, "aten::copy_"), (5, "aten::to"), (25, "-"),
                    (3, "-"), (7, "cudaGraphLaunch"), (10, "-")]
    assert timing._overlap(busy, (0, 100)) == 40 and list(timing._idle((0, 15), busy)) == [
        (0, 10)]
    assert timing._split(events, min_gap_us=21)[3] == gaps[2:6]      # (50, 100) only


def test_batch_bench_trace_smoke(capsys):
    """evals.batch_bench --trace on the CPU: one question's ask and ask_many under
    torch.profiler; with no device every millisecond is idle, charged to the ops running
    (or "-": Python between them)."""
    from evals import batch_bench
    assert batch_bench.main(["--grid", "64", "--contexts", "128", "--repeats", "1",
                             "--questions", "2", "--tail", "10", "--parts", "ask",
                             "--trace"]) == 0
    trace = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["ask"]["128"]["trace"]
    for arm in ("one", "many"):
        t = trace[arm]
        assert t["wall_ms"] > 0 and t["device_busy_ms"] == 0 and t["kernels"] == {}
        assert t["num_kernels"] == 0
        assert t["device_idle_ms"] == t["wall_ms"]
        assert "idle_by_function" not in t
        assert any(name.startswith("aten::") for name in t["idle_by_op"])
        # the top pieces: at most the call's idle time
        assert sum(p["us"] for p in t["idle_by_op"].values()) <= t["device_idle_ms"] * 1e3 + 2


def test_apply_bench_smoke(capsys):
    """evals.apply_bench on the CPU: a first prompt's and a next turn's apply timed for each
    length asked (its times are figures for BENCHMARKS.md; only their presence is checked)."""
    from evals import apply_bench
    assert apply_bench.main(["--lengths", "600,2000", "--repeats", "1", "--grid", "64"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(res["apply"]) == {"600", "2000"} and res["grid"] == 64
    assert all(r["first_prompt_ms"] > 0 and r["next_turn_ms"] > 0 for r in res["apply"].values())
