"""Start-up and the smaller points of issue 19: every bad setting refused before the server
binds, in one line naming the variable or flag and the value, exit code 2; `serve --help` lists
every setting; the start-up lines; 401 with WWW-Authenticate; outputs of a turn that was not
followed; bad ids named by their field; 400 and 422 both with a line in `detail`."""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shadow_plugin.config import ServiceConfig
from shadow_plugin.server.startup import startup_lines
from shadow_plugin.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[1]


def _serve(env: dict, *args: str, timeout: int = 60):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHADOW_")} | env
    return subprocess.run([sys.executable, "-m", "evals.cli", "serve", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("env, args, named", [
    ({"SHADOW_GB": "-1"}, (), "SHADOW_GB=-1"),
    ({"SHADOW_GB": "1e-12"}, (), "SHADOW_GB=1e-12"),
    ({"SHADOW_DEVICE": "tpu"}, (), "SHADOW_DEVICE / --device 'tpu'"),
    ({"SHADOW_MAX_BODY_MB": "0"}, (), "SHADOW_MAX_BODY_MB=0"),
    ({"SHADOW_ASK_WORKERS": "100000"}, (), "SHADOW_ASK_WORKERS=100000"),
    ({"SHADOW_DISK": "/proc/nope"}, (), "SHADOW_DISK='/proc/nope'"),
    ({"SHADOW_DISK_GB": "0"}, (), "SHADOW_DISK_GB=0"),
    ({"SHADOW_DISK_TTL_H": "-2"}, (), "SHADOW_DISK_TTL_H=-2"),
    ({"SHADOW_ASK_WORKERS": "0"}, (), "SHADOW_ASK_WORKERS=0"),
    ({"SHADOW_ASK_QUEUE": "-3"}, (), "SHADOW_ASK_QUEUE=-3"),
    ({"SHADOW_MAX_POSITIONS_POLICY": "truncate"}, (), "SHADOW_MAX_POSITIONS_POLICY='truncate'"),
    ({"SHADOW_THREADS": "many"}, (), "SHADOW_THREADS='many'"),
    ({"SHADOW_HISTORY_S": "0"}, (), "SHADOW_HISTORY_S=0"),
    ({"SHADOW_POLL_S": "soon"}, (), "SHADOW_POLL_S"),
    ({}, ("--port", "99999"), "--port 99999"),
    ({}, ("--grid", "100"), "SHADOW_GRID / --grid"),
    ({"SHADOW_MODEL": "random:huge"}, (), "SHADOW_MODEL 'random:huge'"),
])
def test_a_bad_setting_is_one_line_naming_it_and_exit_2(tmp_path, env, args, named):
    env = {"SHADOW_MODEL": "random:tiny", "SHADOW_DIR": str(tmp_path), **env}
    out = _serve(env, *args)
    assert out.returncode == 2, out.stderr[-500:]
    last = out.stderr.strip().splitlines()[-1]
    assert named in last and "Traceback" not in out.stderr, out.stderr[-500:]


def test_a_bad_profiles_file_and_a_taken_port(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("a: [\n")
    out = _serve({"SHADOW_MODEL": "random:tiny", "SHADOW_DIR": str(tmp_path),
                  "SHADOW_PROFILES": str(bad)})
    assert out.returncode == 2 and "SHADOW_PROFILES=" in out.stderr and "line 2" in out.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = _serve({"SHADOW_MODEL": "random:tiny", "SHADOW_DIR": str(tmp_path)}, "--port",
                     str(port))
    assert out.returncode == 2 and f"--port {port}: cannot bind" in out.stderr
    assert "Traceback" not in out.stderr


def test_serve_help_lists_every_setting():
    out = subprocess.run([sys.executable, "-m", "evals.cli", "serve", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for var, flag, _, _ in SETTINGS:
        assert var in out.stdout and (not flag or flag in out.stdout), var
    config = (ROOT / "shadow_plugin" / "config.py").read_text()
    sched = (ROOT / "shadow_plugin" / "sched_types.py").read_text()
    named = {v for v, *_ in SETTINGS}
    for key in ("GB", "DISK", "DISK_GB", "DISK_TTL_H", "ASK_WORKERS", "THREADS", "POLL_S",
                "IDLE_TRUST"):
        assert f"SHADOW_{key}" in named and (f'"{key}"' in config or key in sched), key


def test_the_startup_lines_name_what_is_in_use(tmp_path):
    cfg = ServiceConfig(model="random:tiny", device="cpu", state_dir=tmp_path, threads=3)
    first, dashboard = startup_lines(cfg, "127.0.0.1", 8765)
    for part in ("random:tiny (seeded random weights) on cpu", "grid 512", "cap 4.0 GiB",
                 "disk off (SHADOW_DISK: a restart remembers nothing)",
                 str(tmp_path / "shadow.jsonl"), "threads 3", "questions 2 at once + 32"):
        assert part in first, part
    assert dashboard == "dashboard at http://127.0.0.1:8765/v1/shadow/dashboard"
    lines = startup_lines(cfg, "0.0.0.0", 8765)
    assert lines[-1].startswith("WARNING: bound to 0.0.0.0 without an API key")
    keyed = ServiceConfig(model="random:tiny", api_key="k", disk_dir=tmp_path / "d")
    assert len(startup_lines(keyed, "0.0.0.0", 1)) == 2
    assert f"disk {tmp_path / 'd'}" in startup_lines(keyed, "0.0.0.0", 1)[0]


def test_small_points_over_http(tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from shadow_plugin.scheduler import SchedulerConfig
    from shadow_plugin.server.app import create_app
    profiles = tmp_path / "p.yaml"
    profiles.write_text("quiet:\n  shadow:\n    mode: off\n")
    cfg = ServiceConfig(model="random:tiny", device="cpu", grid=64, api_key="k",
                        state_dir=tmp_path, profiles_path=profiles,
                        scheduler=SchedulerConfig(grid=64, poll_s=0.02))
    key = {"Authorization": "Bearer k"}
    with TestClient(create_app(cfg), base_url="http://127.0.0.1") as c:
        deadline = time.monotonic() + 60
        while c.get("/healthz").json()["state"] == "loading" and time.monotonic() < deadline:
            time.sleep(0.05)
        r = c.get("/v1/shadow/status")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        r = c.post("/v1/shadow/sessions/q/turn", headers=key,
                   json={"prompt_ids": [1, 2], "profile": "quiet"})
        assert r.json()["followed"] is False
        r = c.post("/v1/shadow/sessions/q/output", headers=key, json={"ids": [3]})
        assert r.status_code == 200 and r.json()["followed"] is False
        r = c.post("/v1/shadow/sessions/q/end", headers=key)
        assert r.status_code == 200 and r.json() == {"ended": "q", "followed": False}
        assert c.delete("/v1/shadow/sessions/q", headers=key).status_code == 200
        r = c.post("/v1/shadow/sessions/b/turn", headers=key, json={"prompt_ids": [1, -5]})
        assert r.status_code == 400 and "prompt_ids[1]" in r.json()["detail"]
        r = c.post("/v1/shadow/sessions/b/turn", headers=key, json={"prompt_ids": "x"})
        assert r.status_code == 422 and isinstance(r.json()["detail"], str)
        assert "prompt_ids" in r.json()["detail"] and r.json()["errors"]


@pytest.mark.parametrize("device, named", [
    ("cuda:x", "cpu, cuda or cuda:N"), ("cpu:1", "cpu, cuda or cuda:N"),
    ("gpu", "cpu, cuda or cuda:N")])
def test_a_device_is_cpu_cuda_or_a_numbered_cuda_device(tmp_path, device, named):
    """What vLLM's worker half sets (cuda:<its GPU>) passes the check; a malformed name is
    refused by name (in process: startup.check_paths)."""
    from shadow_plugin.config import ServiceConfig
    from shadow_plugin.server.startup import check_paths
    base = {"SHADOW_MODEL": "random:tiny", "SHADOW_DIR": str(tmp_path)}
    with pytest.raises(ValueError, match=named):
        check_paths(ServiceConfig.from_env({**base, "SHADOW_DEVICE": device}))
    check_paths(ServiceConfig.from_env({**base, "SHADOW_DEVICE": "cpu"}))
    import torch
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="'cuda:0': no CUDA device"):
            check_paths(ServiceConfig.from_env({**base, "SHADOW_DEVICE": "cuda:0"}))
