"""`fresh --agents N`: the overlay, N=1 against `fresh`, the idle window in the gaps of all, the
engine-wide ration, and fresh shares as agents are added."""
import json
import math
import re

import pytest
from test_fresh import _iso, _timeline

from evals.cli import main
from evals.data import data_dir
from evals.fresh import Request, fresh_report, load_timeline, simulate
from evals.fresh_agents import (
    EngineModel,
    OverlayConfig,
    agents_report,
    batch_ratios,
    batched_costs,
    one_at_a_time,
    overlay,
    simulate_agents,
    span_s,
)
from shadow_plugin.scheduling.scheduler import SchedulerConfig

DATA = data_dir() / "timelines"
T0 = 1767225600.0


def _agent(prompt_tokens, start_s=0.0, first_s=1.0, end_s=11.0, session="s", output_tokens=0):
    return [Request(session, T0 + start_s, T0 + first_s, T0 + end_s, prompt_tokens,
                    output_tokens)]


def _timelines(n=3):
    """n timelines of 12 requests: 3 s prefill, 7 s decode, 5 s gaps, prompts growing."""
    out = []
    for k in range(n):
        reqs, t = [], T0 + 100 * k
        for i in range(12):
            reqs.append(Request(f"t{k}", t, t + 3, t + 10, 2048 * (i + 1) + 300 * k, 200))
            t += 15
        out.append(reqs)
    return out


def test_overlay_is_deterministic_for_a_seed():
    tls = _timelines()
    a = overlay(tls, OverlayConfig(5, seed=7))
    assert a == overlay(tls, OverlayConfig(5, seed=7))
    assert a != overlay(tls, OverlayConfig(5, seed=8))
    assert a[0] == [Request(f"a0:{r.session}", r.start_s, r.first_token_s, r.end_s,
                            r.prompt_tokens, r.output_tokens) for r in tls[0]]
    window = span_s(tls[0])                                    # 12 x 15 - 5 = 175 s
    assert window == 175.0
    for i, reqs in enumerate(a[1:], 1):
        offset = reqs[0].start_s - tls[0][0].start_s           # aligned to agent 0, then moved
        assert 0 <= offset < window
        assert [r.start_s - offset for r in reqs] == pytest.approx(
            [r.start_s - tls[i % 3][0].start_s + T0 for r in tls[i % 3]])
    # N = 5 over 3 timelines: agents 3 and 4 reuse timelines 0 and 1 under their own names
    assert {r.session for r in a[3]} == {"a3:t0"} and {r.session for r in a[4]} == {"a4:t1"}
    assert len({r.session for reqs in a for r in reqs}) == 5
    b = overlay(tls, OverlayConfig(2, seed=7, window_s=0.0), rotation=1)
    assert [r.start_s for r in b[0]] == [r.start_s for r in tls[1]]
    assert [r.start_s for r in b[1]] == [r.start_s - 100 for r in tls[2]]


def test_one_agent_equals_fresh_on_the_scripted_timeline(tmp_path):
    """N=1 is `fresh`'s idle + ration arm: the same trace, ration and waits; the JSON's N=1
    the same fresh share, p50, p90 and host share as fresh_report's idle_ration."""
    path = _timeline(tmp_path)
    reqs = load_timeline(path)
    cfg = SchedulerConfig(idle_trust=0.0, idle_at_finish=False)
    old = simulate(reqs, cfg, lambda c: 10.0, ration=True)
    new = simulate_agents(overlay([reqs], OverlayConfig(1)), cfg, lambda c: 10.0)
    assert [(s.split(":", 1)[1], t, b) for s, t, b in new["trace"]] == old["trace"]
    assert new["ration_ms"] == pytest.approx(46.08) and new["decode_ms"] == pytest.approx(11000)
    assert new["host_share"] == pytest.approx(old["host_share"])
    assert (new["fresh_share"], new["backlog_p90"]) == (1.0, 0)
    rep = agents_report([str(path)], [1], cfg, "10 ms", lambda c: 10.0)["by_agents"]["1"]
    ref = fresh_report([str(path)], cfg, "10 ms", lambda c: 10.0)["idle_ration"]
    assert {k: rep[k] for k in ("fresh_share", "backlog_p50", "backlog_p90", "host_share")} == \
        {k: ref[k] for k in ("fresh_share", "backlog_p50", "backlog_p90", "host_share")}
    assert rep["batch_mean"] == 1.0


@pytest.mark.skipif(not DATA.is_dir(), reason=f"no shared timelines at {DATA}")
@pytest.mark.parametrize("name", ["aider_friendly_names", "gjc_01_youtube_transcripts"])
def test_one_agent_equals_fresh_on_shared_timelines(name):
    reqs = load_timeline(DATA / f"{name}.json")
    cfg, cost = SchedulerConfig(), (lambda c: 7.0 + c / 16384)
    old = simulate(reqs, cfg, cost, ration=True)
    new = simulate_agents(overlay([reqs], OverlayConfig(1)), cfg, cost)
    assert [(s.split(":", 1)[1], t, b) for s, t, b in new["trace"]] == old["trace"]
    assert new["host_waits_ms"] == old["host_waits_ms"]
    decode_ms = sum(r.end_s - r.first_token_s for r in reqs) * 1e3
    assert new["ration_ms"] == pytest.approx(old["host_share"] * decode_ms)


def test_the_host_is_never_idle_while_a_request_runs():
    """Idle chunks only in the gaps of all agents; ration chunks only while some decode."""
    tls = _timelines()
    res = simulate_agents(overlay(tls, OverlayConfig(6, seed=3, window_s=60.0)),
                          SchedulerConfig(), lambda c: 30.0, EngineModel(decode_alpha=0.1))
    spans = res["requests_s"]
    assert len(spans) == 6 * 12 and res["batch_mean"] > 1.5
    idle = [(t0, t1) for t0, t1, window, _ in res["reads"] if window == "idle"]
    ration = [(t0, t1) for t0, t1, window, _ in res["reads"] if window == "ration"]
    assert len(idle) > 10 and len(ration) > 10
    for t0, t1 in idle:
        assert not any(a < t1 and t0 < b for a, b in spans), (t0, t1)
    for t0, _ in ration:
        assert any(a <= t0 <= b for a, b in spans)


def test_the_batch_stretches_decode_and_moves_the_agent():
    """Two agents with one 10 s decode at once, alpha 0.5: each decode runs at batch 2, 1.5 x
    as long (15 s); the second request of agent 0 moves by those 5 s."""
    one = [Request("s", T0, T0 + 1, T0 + 11, 512, 0), Request("s", T0 + 20, T0 + 21, T0 + 22,
                                                              1024, 0)]
    res = simulate_agents(overlay([one, one], OverlayConfig(2, window_s=0.0)),
                          SchedulerConfig(), lambda c: 1.0, EngineModel(decode_alpha=0.5))
    first = sorted(res["requests_s"])[:2]
    assert [b - a for a, b in first] == pytest.approx([16.0, 16.0])
    assert sorted(t - T0 for _, t, _ in res["trace"]) == pytest.approx([0, 0, 25, 25])
    assert res["batch_mean"] == pytest.approx(2.0)


def test_the_engine_wide_ration_is_shared():
    """A 100 s decode over a 40-chunk prompt at 51.2 ms a chunk: alone the turn's 2 % (2 s)
    reads 39 chunks; two such turns at once get one share between them (StepBudget): as many
    chunks in all give or take a slice, not twice as many."""
    cfg = SchedulerConfig(slice_ms=150.0)
    cost = lambda c: 100.0                                       # noqa: E731
    tl = _agent(40 * 512, first_s=0.0, end_s=100.0)
    alone = simulate_agents(overlay([tl], OverlayConfig(1)), cfg, cost, EngineModel(0.0))
    both = simulate_agents(overlay([tl, tl], OverlayConfig(2, window_s=0.0)), cfg, cost,
                           EngineModel(0.0))
    assert alone["decode_ms"] == pytest.approx(100_000)
    assert 100_000 <= both["decode_ms"] <= 100_000 + cfg.slice_ms     # a last slot ran over
    chunks = {s: sum(1 for *_, w, x in both["reads"] if x == s and w == "ration")
              for s in ("a0:s", "a1:s")}
    assert len(alone["reads"]) == 39 and alone["ration_ms"] == pytest.approx(39 * 51.2)
    # StepBudget lets a slice start while under the share: at most one slice (2 chunks) over
    assert sum(chunks.values()) <= 39 + cfg.slice_ms // 51.2 < 2 * 39
    assert min(chunks.values()) >= 19                                   # taken in turn
    assert both["ration_ms"] <= cfg.share * both["decode_ms"] + cfg.slice_ms
    assert alone["host_share"] <= cfg.share < both["host_share"] < 1.1 * cfg.share


@pytest.mark.parametrize("make", ["scripted", "shared"])
def test_more_agents_do_not_raise_the_fresh_share(make):
    """Not a theorem: an agent added takes idle gaps and the one share from the others, but
    its stretch lengthens their decodes (a turn's ration is 2 % of a longer time) and shorter
    gaps make idle trust leave less to the idle window, so a turn can come out fresher. What
    always holds is asserted in the tests above (the idle window in the gaps of all, one share);
    here, on these timelines and costs, N = 2, 4 and 8 are not fresher than N = 1."""
    if make == "shared":
        names = ["aider_friendly_names", "gjc_01_youtube_transcripts"]
        if not DATA.is_dir():
            pytest.skip(f"no shared timelines at {DATA}")
        paths, cost = [str(DATA / f"{n}.json") for n in names], (lambda c: 60.0)
    else:
        paths, cost = [], (lambda c: 40.0)
    cfg = SchedulerConfig()
    if paths:
        res = agents_report(paths, [1, 2, 4], cfg, "60 ms", cost, seed=1)["by_agents"]
        shares = [res[n]["fresh_share"] for n in ("1", "2", "4")]
    else:
        tls = _timelines()
        shares = []
        for n in (1, 2, 4, 8):
            runs = [simulate_agents(overlay(tls, OverlayConfig(n, seed=2), j), cfg, cost)
                    for j in range(3)]
            turns = [b for r in runs for *_, b in r["trace"]]
            shares.append(sum(b < cfg.grid for b in turns) / len(turns))
    assert shares[0] > shares[-1] and all(s <= shares[0] for s in shares[1:]), shares


def test_chunk_cost_hook_one_at_a_time():
    """The default hook sums the cost model's chunks; a hook given is what chunks cost."""
    cost = one_at_a_time(lambda c: 10.0 if c < 8192 else 20.0, 512)
    assert cost((0,)) == 5.12 and cost((0, 8192)) == pytest.approx(15.36)
    tl = _agent(8 * 512, first_s=1.0, end_s=11.0)
    res = simulate_agents(overlay([tl], OverlayConfig(1)), SchedulerConfig(), lambda c: 10.0,
                          chunk_ms=lambda contexts: 1.0 * len(contexts))
    assert res["ration_ms"] == pytest.approx(8.0) and len(res["reads"]) == 8


def test_batched_reads_cost_one_forward_of_their_contexts():
    """With batch_sessions > 1 the idle window (the 5 s gap after both agents' first turns)
    reads two agents' chunks a call: chunk_ms gets both contexts at once (one forward), and
    each chunk is logged over that forward's time."""
    calls = []

    def chunk_ms(contexts):
        calls.append(tuple(contexts))
        return 1.0 * len(contexts)
    tls = [_agent(8 * 512, session=s) + _agent(9 * 512, 16.0, 17.0, 18.0, session=s)
           for s in ("x", "y")]
    agents = overlay(tls, OverlayConfig(2, window_s=0.0))
    res = simulate_agents(agents, SchedulerConfig(batch_sessions=4, share=0.0), lambda c: 10.0,
                          chunk_ms=chunk_ms)
    assert len(res["reads"]) == 16 and any(len(c) == 2 for c in calls), calls
    pairs = [(t0, t1) for t0, t1, *_ in res["reads"]]
    assert any(pairs.count(p) == 2 for p in pairs)


def test_cli_agents_table_and_json(tmp_path, capsys):
    path = str(_timeline(tmp_path))
    assert main(["fresh", path, "--agents", "1,2", "--read-ms-per-1k", "10", "--seed",
                 "4"]) == 0
    out = capsys.readouterr()
    lines = out.out.strip().splitlines()
    res = json.loads(lines[-1])
    assert lines[0].startswith("| agents | turns | fresh |") and lines[2].startswith("| 1 | 2 |")
    assert res["by_agents"]["1"]["fresh_share"] == 1.0 and res["by_agents"]["2"]["turns"] == 4
    assert res["reused"] == [2] and "exceeds the 1 timelines" in out.err
    assert res["cost_model"] == "10.0 ms per 1,000 ids" and res["seed"] == 4
    assert res["engine"] == {"decode_alpha": 0.08, "round_s": 0.1}
    assert set(res["versions"]) == {"shadow_reader", "python"} and len(res["date"]) == 10
    with pytest.raises(SystemExit) as bad:
        main(["fresh", path, "--agents", "0"])
    assert bad.value.code == 2 and "expected positive counts" in capsys.readouterr().err
    assert main(["fresh", path, "--agents", "2", "--plot", str(tmp_path / "x.png")]) == 2
    assert "leave out --agents" in capsys.readouterr().err


def test_engine_model_refuses_bad_values():
    assert EngineModel(0.5).stretch(3) == 2.0 and EngineModel().stretch(0) == 1.0
    with pytest.raises(ValueError, match="decode_alpha"):
        EngineModel(decode_alpha=-1)
    with pytest.raises(ValueError, match="round_s"):
        EngineModel(round_s=math.inf)
    with pytest.raises(ValueError, match="num_agents"):
        OverlayConfig(0)


def _arm(ms, b, grid=512):
    return {"ms": ms, "chunks_per_s": round(b / ms * 1e3, 1),
            "ids_per_s": round(b * grid / ms * 1e3)}


def _bench(rows, exact=None, nested=True, grid=512):
    """A bi_bench JSON in the shape `python -m evals.bi_bench --out` writes: run info, "probe",
    "speed" and "read" ({context}x{B} rows with the arms' ms; {context}_exact). rows:
    {(context, B): (bi_alone ms, bi_batch ms or None)}; exact: {context: its _exact entry}
    (default: batches and exact)."""
    read = {}
    for (c, b), (alone, batch) in rows.items():
        row = {"context": c, "sessions": b, "today": _arm(alone * 1.5, b),
               "bi_alone": _arm(alone, b)}
        if batch is not None:
            row["bi_batch"] = _arm(batch, b)
            row["speedup"] = round(alone / batch, 3)
            row["over_today"] = round(alone * 1.5 / batch, 3)
        read[f"{c}x{b}"] = row
    for c in sorted({c for c, _ in rows}):
        read[f"{c}_exact"] = (exact or {}).get(c, {"batches": True, "exact": True,
                                                   "sessions_equal": 8, "sessions": 8})
    if not nested:
        return read
    return {"model": "random:qwen3.5-0.8b", "grid": grid, "dtype": "torch.bfloat16",
            "gpu": "synthetic", "torch": "2.x", "cuda": "12.x", "triton": None, "fla": None,
            "commit": "abc1234", "date": "2026-12-06", "probe": {}, "speed": {}, "read": read}


# bi_batch / bi_alone: 16k: B=2 0.75, 4 0.5, 8 0.375 (B=1's 1.1 is not used: 1 by definition);
# 64k: B=2 1.0, 4 0.75, 8 0.5
BENCH_ROWS = {(16384, 1): (2.0, 2.2), (16384, 2): (4.0, 3.0), (16384, 4): (8.0, 4.0),
              (16384, 8): (16.0, 6.0), (65536, 2): (4.0, 4.0), (65536, 4): (8.0, 6.0),
              (65536, 8): (16.0, 8.0)}


@pytest.mark.parametrize("nested", [True, False])
def test_batched_costs_interpolate_the_measured_ratio(nested):
    """1 ms a chunk one at a time (1,000 ids a chunk at 1 ms per 1,000): a forward of B chunks
    costs B x the ratio, linear in B and in the mean context, clamped outside."""
    bench = _bench(BENCH_ROWS, nested=nested, grid=1000)
    if not nested:
        bench = dict(bench)                    # the read part alone: no grid to check
    assert batch_ratios(bench, 1000) == {16384: [(2, 0.75), (4, 0.5), (8, 0.375)],
                                         65536: [(2, 1.0), (4, 0.75), (8, 0.5)]}
    cost = batched_costs(bench, lambda c: 1.0, 1000)
    assert cost((16384,)) == 1.0 and cost((65536,)) == 1.0            # B = 1: one at a time
    assert cost((16384,) * 2) == 1.5 and cost((16384,) * 4) == 2.0    # measured points
    assert cost((16384,) * 3) == 3 * 0.625                            # between B = 2 and 4
    assert cost((65536,) * 6) == 6 * 0.625
    assert cost((16384,) * 16) == 16 * 0.375                          # past B = 8: B = 8's
    assert cost((16384, 65536)) == 2 * 0.875                          # mean context 40,960
    assert cost((0, 0, 0, 0)) == 4 * 0.5 and cost((10**6,) * 4) == 4 * 0.75     # clamped
    # the one-at-a-time sum is the cost model's at each chunk's own context
    steps = batched_costs(bench, lambda c: 1.0 if c < 32768 else 3.0, 1000)
    assert steps((16384, 65536)) == (1.0 + 3.0) * 0.875
    assert steps((16384, 16384, 65536, 65536)) == (1.0 + 1.0 + 3.0 + 3.0) * 0.625
    # B = 3 at a mean of 34,133: 0.625 at 16k, 0.875 at 64k, 0.3611 of the way
    assert steps((20480, 20480, 61440)) == pytest.approx(5.0 * (0.625 + 0.25 * (17749 + 1 / 3)
                                                               / 49152), rel=1e-12)


@pytest.mark.parametrize("bench, message", [
    (_bench({(16384, 2): (4.0, None), (16384, 4): (8.0, None)},
            exact={16384: {"batches": False}}), "16384: the adapter did not batch"),
    (_bench({(16384, 4): (8.0, 4.0)}, exact={16384: {"batches": True, "exact": False}}),
     "16384: the batched states were not bit-exact"),
    (_bench({(16384, 4): (8.0, None)}, exact={16384: {"batches": True}}),
     "16384x4: no bi_alone and bi_batch ms"),
    (_bench({(16384, 1): (2.0, 2.0)}), "no usable batched read rows"),
    ({"read_grid512": {}}, "no usable batched read rows"),
    (_bench({(16384, 4): (8.0, 4.0)}, grid=256), "measured at grid 256"),
    ([1, 2], "not a bi_bench JSON object"),
])
def test_batched_costs_refuse_files_without_usable_rows(bench, message):
    with pytest.raises(ValueError, match=message):
        batched_costs(bench, lambda c: 10.0, 512)


def test_batched_costs_leave_out_contexts_that_did_not_batch():
    bench = _bench({(16384, 4): (8.0, 4.0), (65536, 4): (8.0, None)},
                   exact={65536: {"batches": False}})
    assert batch_ratios(bench, 512) == {16384: [(4, 0.5)]}
    assert batched_costs(bench, lambda c: 10.0, 512)((65536,) * 4) == \
        pytest.approx(4 * 5.12 * 0.5)


def _chunks_bench(rows: dict, exact: bool = True, nested: bool = True) -> dict:
    """A bi_bench --parts chunks JSON: rows {(context, B): (one at a time ms, one forward
    ms)}."""
    part = {}
    for (c, b), (alone, batch) in rows.items():
        row = {"one_at_a_time": alone, "one_forward": batch,
               "speedup": round(alone / batch, 3)}
        if b > 1:
            row["exact"] = exact
        part[f"{c}x{b}"] = row
    part["captures"] = {"num_graphs": 3, "chunk_batches": [2, 4, 8]}
    return {"grid": 512, "gpu": "synthetic", "chunks": part} if nested else part


@pytest.mark.parametrize("nested", [True, False])
def test_batched_costs_read_the_graphs_chunks_part(nested):
    """bi_bench's `chunks` part (the CUDA graphs' batched read) gives one forward's ms over
    one at a time's; it wins over a `read` part in the same file."""
    rows = {(16384, 1): (4.0, 4.0), (16384, 2): (8.0, 7.0), (16384, 4): (16.0, 12.0),
            (65536, 4): (20.0, 18.0)}
    bench = _chunks_bench(rows, nested=nested)
    if nested:
        bench["read"] = _bench(BENCH_ROWS, nested=False)
    assert batch_ratios(bench, 512) == {16384: [(2, 0.875), (4, 0.75)], 65536: [(4, 0.9)]}
    cost = batched_costs(bench, lambda c: 2.0, 512)
    assert cost((16384,) * 4) == pytest.approx(4 * 1.024 * 0.75)
    assert cost((65536,) * 2) == pytest.approx(2 * 1.024 * (1 - 0.1 / 3))   # 1 at B = 1, 0.9 at 4


def test_batched_costs_take_the_row_invariant_ops_arms_where_the_bench_has_them():
    bench = _chunks_bench({(16384, 4): (16.0, 12.0)})
    bench["chunks"]["16384x4"].update(rowwise_one_at_a_time=15.0, rowwise_one_forward=10.0,
                                      rowwise_exact=True)
    assert batch_ratios(bench, 512) == {16384: [(4, 10.0 / 15.0)]}
    bench["chunks"]["chunk_ops"] = ["compiled", "rowwise"]          # as bi_bench records it
    assert batch_ratios(bench, 512) == {16384: [(4, 10.0 / 15.0)]}
    bench["chunks"]["chunk_ops"] = ["compiled"]                     # the unprefixed arms
    assert batch_ratios(bench, 512) == {16384: [(4, 0.75)]}
    bench["chunks"]["chunk_ops"] = ["rowwise", "compiled"]          # the unprefixed arms
    assert batch_ratios(bench, 512) == {16384: [(4, 0.75)]}
    bench["chunks"]["chunk_ops"] = ["compiled", "rowwise"]
    bench["chunks"]["16384x4"]["rowwise_exact"] = False
    with pytest.raises(ValueError, match="16384x4: the batched chunks were not bit-exact"):
        batch_ratios(bench, 512)


def test_batched_costs_leave_out_chunk_batches_that_were_not_exact():
    bench = _chunks_bench({(16384, 4): (16.0, 12.0)}, exact=False)
    with pytest.raises(ValueError, match="16384x4: the batched chunks were not bit-exact"):
        batch_ratios(bench, 512)
    bench["chunks"]["16384x2"] = {"one_at_a_time": 8.0, "exact": True}
    with pytest.raises(ValueError, match="16384x2: no one_at_a_time and one_forward ms"):
        batch_ratios(bench, 512)


def _lockstep_timeline(tmp_path):
    """One session: 6 requests of 1 s prefill and 1 s decode, 0.6 s apart, each prompt 8
    chunks longer (4,096 ids)."""
    reqs, t = [], 0.0
    for i in range(6):
        reqs.append({"request_start": _iso(t), "first_token": _iso(t + 1),
                     "request_end": _iso(t + 2), "prompt_tokens": 4096 * (i + 1),
                     "output_tokens": 0})
        t += 2.6
    path = tmp_path / "lockstep.json"
    path.write_text(json.dumps({"sessions": [{"session_id": "s", "requests": reqs}]}))
    return str(path)


def test_cli_agents_with_batch_costs(tmp_path, capsys):
    """Two agents in lockstep (--window-s 0), 51.2 ms a chunk: each 0.6 s gap has 16 chunks
    waiting, 819 ms one at a time but 410 ms in pairs at the measured ratio 0.5: batched
    costs keep the shadow fresh where one at a time falls behind, and a forward of the same
    two chunks costs half."""
    path = _lockstep_timeline(tmp_path)
    bench = tmp_path / "bi.json"
    bench.write_text(json.dumps(_bench({(16384, b): (10.0 * b, 10.0 if b == 1 else 5.0 * b)
                                        for b in (1, 2, 4, 8)})))
    args = ["fresh", path, "--agents", "1,2", "--read-ms-per-1k", "100", "--window-s", "0",
            "--batch-sessions", "4"]
    assert main(args) == 0
    out = capsys.readouterr()
    one = json.loads(out.out.strip().splitlines()[-1])
    assert "simulation, one-at-a-time chunk costs;" in out.err
    assert one["simulation"].startswith("one-at-a-time chunk costs")
    assert main(args + ["--batch-costs", str(bench)]) == 0
    out = capsys.readouterr()
    lines = out.out.strip().splitlines()
    both = json.loads(lines[-1])
    assert f"simulation, batched chunk costs from {bench}, batches of up to 4;" in out.err
    assert both["simulation"].startswith("batched chunk costs: a forward of B chunks")
    assert "16384: B=2 0.500, B=4 0.500, B=8 0.500" in both["simulation"]
    assert "synthetic" in both["simulation"] and both["scheduler"]["batch_sessions"] == 4
    assert lines[0].startswith("| agents | turns | fresh |") and "shadow forward" in lines[0]
    a, b = one["by_agents"]["2"], both["by_agents"]["2"]
    assert (a["fresh_share"], a["backlog_p90"]) == (pytest.approx(2 / 12, abs=1e-4), 5120)
    assert (b["fresh_share"], b["backlog_p90"]) == (1.0, 0)
    assert a["chunks_per_forward"] == b["chunks_per_forward"] == 2.0
    assert (a["forward_ms_mean"], b["forward_ms_mean"]) == (102.4, 51.2)
    assert one["by_agents"]["1"] == {**both["by_agents"]["1"], "furthest_behind":
                                     one["by_agents"]["1"]["furthest_behind"]}
    assert "| 2 | 12 | 100.0% | 0 / 0 |" in lines[3] and "51.20 (2.00)" in lines[3]


def test_cli_batch_costs_refused(tmp_path, capsys, monkeypatch):
    path = _lockstep_timeline(tmp_path)
    monkeypatch.delenv("SHADOW_BATCH_SESSIONS", raising=False)
    good = tmp_path / "bi.json"
    good.write_text(json.dumps(_bench({(16384, 4): (8.0, 4.0)})))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_bench({(16384, 4): (8.0, None)},
                                     exact={16384: {"batches": False}})))
    (tmp_path / "junk.json").write_text("{not json")
    base = ["fresh", path, "--agents", "2", "--read-ms-per-1k", "100"]
    cases = [(base + ["--batch-costs", str(good)], "pass --batch-sessions N"),
             (base + ["--batch-costs", str(good), "--batch-sessions", "1"],
              "pass --batch-sessions N"),
             (base + ["--batch-costs", str(good), "--batch-sessions", "65"],
              r"--batch-sessions: batch_sessions must be an integer in \[1, 64\]"),
             (base + ["--batch-costs", str(bad), "--batch-sessions", "4"],
              f"--batch-costs {bad}: no usable batched read rows .*16384: the adapter did not "
              "batch"),
             (base + ["--batch-costs", str(tmp_path / "junk.json"), "--batch-sessions", "4"],
              "not JSON"),
             (["fresh", path, "--batch-costs", str(good), "--batch-sessions", "4"],
              "--batch-costs is for --agents")]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "shadow-reader: error:" in err and re.search(message, err), err
    monkeypatch.setenv("SHADOW_BATCH_SESSIONS", "2")              # the variable does too
    assert main(base + ["--batch-costs", str(good)]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["scheduler"]["batch_sessions"] == 2
