"""`shadow-reader serve` started as a user starts it, in a subprocess: a bad setting is one line naming it and exit 2, a bad profiles file and a taken port, --help lists every setting."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from shadow_plugin.server.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[2]


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
    ({"SHADOW_ATTENTION": "fa5"}, (), "SHADOW_ATTENTION='fa5'"),
    ({"SHADOW_ATTENTION": "table", "SHADOW_DEVICE": "cpu"}, (), "SHADOW_ATTENTION='table'"),
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
    bad.write_text("a:\n  shadow: {router_min_tokens: [1]}\n")       # issue 34: a traceback
    out = _serve({"SHADOW_MODEL": "random:tiny", "SHADOW_DIR": str(tmp_path),
                  "SHADOW_PROFILES": str(bad)})
    assert out.returncode == 2 and "profile 'a': shadow.router_min_tokens" in out.stderr
    assert "Traceback" not in out.stderr
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
    config = (ROOT / "shadow_plugin" / "server" / "config.py").read_text()
    sched = (ROOT / "shadow_plugin" / "scheduling" / "sched_types.py").read_text()
    named = {v for v, *_ in SETTINGS}
    for key in ("GB", "DISK", "DISK_GB", "DISK_TTL_H", "ASK_WORKERS", "THREADS", "POLL_S",
                "IDLE_TRUST"):
        assert f"SHADOW_{key}" in named and (f'"{key}"' in config or key in sched), key
