"""evals.vllm.client.stream_timing over a scripted stream (no server): TTFT, decode rate and
the gaps between tokens as they arrive (a stall shows as one slow gap)."""
import contextlib
import json
from types import SimpleNamespace

import pytest

from evals.vllm import client


def _line(ids):
    return "data: " + json.dumps({"choices": [{"token_ids": ids}]})


def test_stream_timing_gives_ttft_rate_and_the_stall_as_a_slow_gap(monkeypatch):
    # the request at t=0; tokens 1 ms apart from t=0.3 s, one 40 ms stall after the 5th
    arrivals = [0.3 + 0.001 * i + (0.039 if i >= 5 else 0.0) for i in range(10)]
    clock = iter([0.0] + arrivals + [arrivals[-1]])
    monkeypatch.setattr(client.time, "perf_counter", lambda: next(clock))
    lines = [_line([100 + i]) for i in range(10)] + ["data: [DONE]"]

    @contextlib.contextmanager
    def stream(method, url, json, timeout):
        assert json["max_tokens"] == 10 and json["kv_transfer_params"] == {"k": 1}
        yield SimpleNamespace(status_code=200, iter_lines=lambda: iter(lines))
    server = SimpleNamespace(url="http://x", spec=SimpleNamespace(name="host"),
                             http=SimpleNamespace(stream=stream))       # the kept client
    out = client.stream_timing(server, [1, 2, 3], 10, {"k": 1})
    assert out["tokens"] == 10 and out["ttft_ms"] == pytest.approx(300.0)
    assert out["decode_tok_s"] == pytest.approx(9 / (arrivals[-1] - arrivals[0]))
    assert out["gap_ms_median"] == pytest.approx(1.0)
    assert out["gap_ms_max"] == pytest.approx(40.0)
    assert out["slow_gaps_ms"] == [pytest.approx(40.0)]
