"""The fresh tool: a scripted timeline worked out by hand, and every shared timeline."""
import json
from pathlib import Path

import pytest

from evals.cli import main
from evals.data import data_dir
from evals.fresh import SimReader, fresh_report, load_timeline, percentile, simulate
from shadow_plugin.scheduling.sched_types import VirtualClock
from shadow_plugin.scheduling.scheduler import SchedulerConfig

T0 = 1767225600.0            # 2026-01-01T00:00:00Z
DATA = data_dir() / "timelines"


def _iso(s):
    from datetime import datetime, timezone
    return datetime.fromtimestamp(T0 + s, timezone.utc).isoformat().replace("+00:00", "Z")


def _timeline(tmp_path):
    reqs = [{"request_start": _iso(0), "first_token": _iso(1), "request_end": _iso(11),
             "prompt_tokens": 4096, "output_tokens": 0},
            {"request_start": _iso(11.05), "first_token": _iso(12.05), "request_end": _iso(13.05),
             "prompt_tokens": 4608, "output_tokens": 0}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"sessions": [{"session_id": "s", "requests": reqs}]}))
    return path


def test_scripted_timeline_by_hand(tmp_path):
    """10 ms per 1,000 ids: a 512-id chunk costs 5.12 ms. The seed's scheduler, idle alone: the
    0.05 s gap before the second request is shorter than a poll, so its 4,096 held ids are all
    behind. With the ration, 2 % of the first decode pays for the 8 chunks (40.96 ms) after
    2.05 s; the second turn's chunk (5.12 ms) after 0.3 s of its decode: 46.08 ms over 11 s of
    decode. The default scheduler opens the idle window at the first turn's finish: its 8
    chunks (40.96 ms) fit the 50 ms gap, so idle alone is fresh too."""
    reqs = load_timeline(_timeline(tmp_path))
    default = simulate(reqs, SchedulerConfig(), lambda c: 10.0, ration=False)
    assert (default["fresh_share"], default["backlog_p90"]) == (1.0, 0)
    cfg = SchedulerConfig(idle_trust=0.0, idle_at_finish=False)
    idle = simulate(reqs, cfg, lambda c: 10.0, ration=False)
    assert (idle["fresh_share"], idle["backlog_p50"], idle["backlog_p90"]) == (0.5, 0, 4096)
    both = simulate(reqs, cfg, lambda c: 10.0, ration=True)
    assert (both["fresh_share"], both["backlog_p50"], both["backlog_p90"]) == (1.0, 0, 0)
    assert both["host_share"] == pytest.approx(46.08 / 11000)
    report = fresh_report([str(_timeline(tmp_path))], cfg, "10 ms per 1k", lambda c: 10.0)
    assert report["idle"] == {"fresh_share": 0.5, "backlog_p50": 0, "backlog_p90": 4096,
                              "num_host_waits": 0, "host_wait_ms_max": 0.0}
    assert report["idle_ration"]["host_share"] == round(46.08 / 11000, 5)
    assert report["turns"] == 2


def test_percentile_nearest_rank():
    assert percentile([], 0.5) == 0
    assert percentile([5, 1, 3], 0.5) == 3 and percentile([0, 4096], 0.9) == 4096


@pytest.mark.skipif(not DATA.is_dir(), reason=f"no shared timelines at {DATA}")
@pytest.mark.parametrize("path", sorted(DATA.glob("*.json")), ids=lambda p: p.stem)
def test_every_shared_timeline(path, capsys):
    assert main(["fresh", str(path), "--read-ms-per-1k", "100"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["turns"] > 0
    assert res["idle_ration"]["fresh_share"] >= res["idle"]["fresh_share"]
    assert 0 <= res["idle_ration"]["host_share"] <= 0.02 + 1e-9


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "backlog.png"
    assert main(["fresh", str(_timeline(tmp_path)), "--read-ms-per-1k", "10",
                 "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fresh_refuses_bad_input_naming_it(tmp_path, capsys):
    """A grid that is not a multiple of 64, a negative rate, a file that is not JSON or not a
    timeline: clear errors (exit 2), no figures."""
    good = str(_timeline(tmp_path))
    assert main(["fresh", good, "--grid", "0"]) == 2
    assert "--grid must be a positive multiple of 64" in capsys.readouterr().err
    assert main(["fresh", good, "--read-ms-per-1k", "-5"]) == 2
    assert "--read-ms-per-1k must be > 0" in capsys.readouterr().err
    for text, says in (("nope", "not JSON"), ("{}", "not a request timeline"),
                       ('{"sessions": []}', "the timeline holds no requests")):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        assert main(["fresh", str(bad)]) == 2
        assert f"{bad}: {says}" in capsys.readouterr().err
    for field, value, says in (("prompt_tokens", "abc", "prompt_tokens = 'abc' is not a "
                                "non-negative count"),
                               ("prompt_tokens", -5, "prompt_tokens = -5 is not a non-negative"),
                               ("prompt_tokens", 1e400, "prompt_tokens = inf is not a"),
                               ("request_start", "yesterday", "request_start = 'yesterday' is "
                                "not a time"),
                               ("request_end", _iso(-5), "ends before it starts")):
        raw = json.loads(Path(good).read_text())
        raw["sessions"][0]["requests"][0][field] = value
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(raw))
        assert main(["fresh", str(bad)]) == 2
        assert f"{bad}: request 0 of s" in (err := capsys.readouterr().err) and says in err, err


def test_fresh_reports_the_scheduler_settings(tmp_path, capsys, monkeypatch):
    """The JSON says which scheduler settings the figures come from (SHADOW_* apply)."""
    monkeypatch.setenv("SHADOW_IDLE_AT_FINISH", "0")
    assert main(["fresh", str(_timeline(tmp_path))]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["scheduler"]["idle_at_finish"] is False and res["scheduler"]["share"] == 0.02


def _two_sessions(tmp_path):
    """Two sessions of 4,096 ids each whose turns end together, then a 5 s gap, then a turn
    of each: the idle window has two sessions' chunks to read at once."""
    sessions = []
    for name in ("a", "b"):
        reqs = [{"request_start": _iso(0), "first_token": _iso(1), "request_end": _iso(11),
                 "prompt_tokens": 4096, "output_tokens": 0},
                {"request_start": _iso(16), "first_token": _iso(17), "request_end": _iso(18),
                 "prompt_tokens": 4608, "output_tokens": 0}]
        sessions.append({"session_id": name, "requests": reqs})
    path = tmp_path / "two.json"
    path.write_text(json.dumps({"sessions": sessions}))
    return path


def test_sim_reader_reads_a_batch_one_chunk_after_another():
    clock = VirtualClock(0.0)
    reader = SimReader(clock, 512, lambda c: 10.0)
    reader.prompt("a", 1024)
    reader.prompt("b", 2048)
    ms, read = reader.read_chunks(["a", "b"])
    assert ms == pytest.approx(10.24) and read == ["a", "b"]
    assert reader.c == {"a": 512, "b": 512} and clock.t == pytest.approx(0.01024)


def test_fresh_with_batched_reads(tmp_path, capsys, monkeypatch):
    """SHADOW_BATCH_SESSIONS > 1 has the scheduler read several sessions' chunks a call (it
    stopped at `SimReader` having no read_chunks); with one-at-a-time costs the two sessions'
    16 chunks (81.92 ms) fit the gap either way, so both turns start fresh."""
    reqs = load_timeline(_two_sessions(tmp_path))
    for batch in (1, 4):
        res = simulate(reqs, SchedulerConfig(batch_sessions=batch), lambda c: 10.0,
                       ration=False)
        assert res["fresh_share"] == 1.0 and res["backlog_p90"] == 0, (batch, res)
    monkeypatch.setenv("SHADOW_BATCH_SESSIONS", "4")
    assert main(["fresh", str(_two_sessions(tmp_path)), "--read-ms-per-1k", "10"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["scheduler"]["batch_sessions"] == 4
    assert res["idle_ration"]["fresh_share"] == 1.0


def test_a_request_that_meets_an_idle_chunk_waits_for_it(tmp_path):
    """The window opens at the first turn's finish (11 s) and reads 5.12 ms chunks; the next
    request comes 30 ms later, while the 6th chunk (25.6 to 30.72 ms) runs: it waits 0.72 ms,
    and the burst stops there (6 of the 8 chunks read: 2 left, not fresh)."""
    path = _timeline(tmp_path)
    raw = json.loads(path.read_text())
    raw["sessions"][0]["requests"][1]["request_start"] = _iso(11.03)
    path.write_text(json.dumps(raw))
    res = simulate(load_timeline(path), SchedulerConfig(), lambda c: 10.0, ration=False)
    assert [round(w, 2) for w in res["host_waits_ms"]] == [0.72]
    assert [b for *_, b in res["trace"]] == [0, 2 * 512]


def test_fresh_without_costs_uses_the_shipped_h200_run_and_says_so(tmp_path, capsys):
    assert main(["fresh", str(_timeline(tmp_path))]) == 0
    out = capsys.readouterr()
    res = json.loads(out.out.strip().splitlines()[-1])
    assert "read_costs_h200.json (NVIDIA H200, 2026-12-01" in res["cost_model"]
    assert "0k-8k 6.76" in res["cost_model"] and "read costs: " in out.err
    assert main(["fresh", str(_timeline(tmp_path)), "--read-ms-per-1k", "100"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["cost_model"] == "100.0 ms per 1,000 ids"
