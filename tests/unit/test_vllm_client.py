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


def test_a_server_keeps_one_client_a_thread_and_its_stop_closes_them(tmp_path, monkeypatch):
    import threading

    from evals.vllm.server import ServerSpec, VllmServer
    server = VllmServer(ServerSpec("model"), tmp_path / "log", port=1, pid=1)
    mine = server.http
    assert server.http is mine and not mine.is_closed
    other = []
    t = threading.Thread(target=lambda: other.append(server.http))
    t.start()
    t.join()
    assert other[0] is not mine and not other[0].is_closed
    monkeypatch.setattr(VllmServer, "alive", lambda self: False)
    monkeypatch.setattr(VllmServer, "group_alive", lambda self: False)
    assert server.stop() is None                   # known by pid only: no exit status
    assert mine.is_closed and other[0].is_closed
    again = server.http                            # a closed client is replaced
    assert again is not mine and not again.is_closed
    server.close_clients()
    assert again.is_closed


def test_the_trials_host_with_the_shadow_gets_its_settings_and_the_others_none(monkeypatch):
    """`trial up S` passes the shadow's settings (the share among them: --share, else $SHARE,
    else the seed's 0.02; the batch: --batch-sessions, else $BATCH_SESSIONS, else 1) to S's
    environment; A and P get none."""
    from evals.vllm.trial import build_parser
    monkeypatch.delenv("SHARE", raising=False)
    monkeypatch.delenv("BATCH_SESSIONS", raising=False)
    args = build_parser().parse_args(["up", "S", "--share", "0.01", "--idle-trust", "0.5"])
    env = client.server_spec("S", args).env
    assert (env["SHADOW_SHARE"], env["SHADOW_IDLE_TRUST"]) == ("0.01", "0.5")
    assert env["SHADOW_BATCH_SESSIONS"] == "1"
    monkeypatch.setenv("BATCH_SESSIONS", "4")
    assert client.server_spec("S", build_parser().parse_args(["up", "S"])).env[
        "SHADOW_BATCH_SESSIONS"] == "4"
    args = build_parser().parse_args(["up", "S", "--batch-sessions", "2"])
    assert client.server_spec("S", args).env["SHADOW_BATCH_SESSIONS"] == "2"
    assert env["SHADOW_MODEL"] == "random:qwen3.5-0.8b" and env["SHADOW_GB"] == "12.0"
    monkeypatch.setenv("SHARE", "0.005")
    args = build_parser().parse_args(["up", "A"])
    assert args.share == 0.005 and not client.server_spec("A", args).env
    assert build_parser().parse_args(["up", "P", "--no-wait"]).no_wait


def test_a_launched_server_is_recorded_before_any_wait(tmp_path, monkeypatch):
    """launch_recorded writes the server into the trial's state before it returns, with no
    wait for it: a call cut off while the server starts (the restart of `follow`) leaves it
    findable by pid, and a server in the state that is alive is the one `up` waits for."""
    import os

    from evals.vllm.server import ServerSpec, VllmServer
    monkeypatch.setenv("TRIAL_DIR", str(tmp_path))
    spec = ServerSpec("/models/host", "host", True, 4096, None)
    launched = []

    def launch(s, log, detached=False):          # a live process's pid: this one's
        assert s is spec and detached
        launched.append(VllmServer(s, log, pid=os.getpid()))
        return launched[-1]
    monkeypatch.setattr(VllmServer, "launch", staticmethod(launch))
    server = client.launch_recorded("S", spec, tmp_path / "logs" / "S-restart.log")
    assert launched == [server]
    found = client.load_servers()["S"]              # as the next call's `up` reads it
    assert found.pid == os.getpid() and found.port == server.port and found.alive()
    assert found.log == tmp_path / "logs" / "S-restart.log"
    assert not (tmp_path / "servers.json.tmp").exists()      # written whole, then replaced


def test_a_restart_cut_off_in_its_wait_leaves_the_new_server_recorded(tmp_path, monkeypatch):
    """follow.restart: the new S is in the state before the wait for it ends, so a wait that
    fails (or a call cut off during it) leaves it findable by `up` and `down`."""
    from evals.vllm import follow
    from evals.vllm.server import ServerSpec, VllmServer
    monkeypatch.setenv("TRIAL_DIR", str(tmp_path))
    spec = ServerSpec("/models/host", "host", True, 4096, None)
    old = SimpleNamespace(spec=spec, stop=lambda: 0)
    new = VllmServer(spec, tmp_path / "logs" / "S-restart.log", pid=424242)

    def wait_ready(timeout_s, kill_after=True):
        assert client.load_servers()["S"].pid == 424242       # recorded before the wait
        raise TimeoutError("vLLM not ready")
    new.wait_ready = wait_ready
    monkeypatch.setattr(VllmServer, "launch", staticmethod(lambda s, log, detached=False: new))
    with pytest.raises(TimeoutError):
        follow.restart(SimpleNamespace(start_timeout_s=1.0), old, [], {}, {}, 0)
    assert client.load_servers()["S"].pid == 424242


def test_up_stops_what_is_left_of_a_recorded_server_before_starting_another(tmp_path,
                                                                            monkeypatch):
    """A recorded S whose API process is gone but whose engine lives on, or whose shadow
    failed to load, is stopped before a new S starts beside it; a live, loading one is
    waited for and never started twice."""
    from evals.vllm import trial
    monkeypatch.setenv("TRIAL_DIR", str(tmp_path))     # a fresh S clears the trial's folders
    events = []

    class Left:
        pid, url = 7, "http://x"

        def __init__(self, alive, group_alive, state=None):
            self._alive, self._group, self._state = alive, group_alive, state

        def present(self):
            return self._alive or self._group

        def alive(self):
            return self._alive

        def state(self):
            return self._state

        def ready(self):
            return self._state == "ready"

        def stop(self):
            events.append("stop")
            self._alive = self._group = False
    launched = SimpleNamespace(url="http://new")
    monkeypatch.setattr(trial, "server_spec", lambda name, args: "spec")
    monkeypatch.setattr(trial, "launch_recorded",
                        lambda name, spec, log: events.append(("launch", name)) or launched)
    args = SimpleNamespace(name="S", log_suffix="", no_wait=True)
    for left, expected in ((Left(False, True), ["stop", ("launch", "S")]),       # its engine
                           (Left(True, True, "failed"), ["stop", ("launch", "S")]),
                           (Left(False, False), [("launch", "S")]),               # all gone
                           (Left(True, True, "loading"), [])):                    # waited for
        events.clear()
        monkeypatch.setattr(trial, "load_servers", lambda: {"S": left})
        trial.up(args)
        assert events == expected
