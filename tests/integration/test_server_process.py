"""The real server in a subprocess on a loopback port: SIGTERM writes the sessions to disk, and
a restarted server continues them from there."""
import random
import signal
import time

import pytest

httpx = pytest.importorskip("httpx")
from serving import free_port, start  # noqa: E402

G = 64


def _start(tmp_path, port):
    return start({"SHADOW_GRID": str(G), "SHADOW_DISK": str(tmp_path / "disk"),
                  "SHADOW_DIR": str(tmp_path)}, port, timeout_s=90)


def _wait_committed(url, sid, n):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        s = httpx.get(f"{url}/v1/shadow/status").json()["sessions"][sid]
        if s["committed"] >= n:
            return s
        time.sleep(0.05)
    raise AssertionError("the reader did not catch up")


def test_sigterm_writes_sessions_and_a_restart_continues(tmp_path):
    rng = random.Random(0)
    prompt = [rng.randrange(1000, 240000) for _ in range(5 * G + 7)]
    port = free_port()
    proc, url = _start(tmp_path, port)
    try:
        httpx.post(f"{url}/v1/shadow/sessions/s/turn", json={"prompt_ids": prompt})
        httpx.post(f"{url}/v1/shadow/sessions/s/end")
        _wait_committed(url, "s", 5 * G)
    finally:
        proc.send_signal(signal.SIGTERM)
        # a planned stop that wrote every session exits 0 (issue 34: it was -15, uvicorn
        # raising the captured SIGTERM again)
        assert proc.wait(timeout=60) == 0
    disk = tmp_path / "disk"
    assert len(list((disk / "sessions").rglob("*.safetensors"))) == 1          # one manifest
    assert len(list((disk / "pages").glob("*.safetensors"))) == 5             # its pages
    proc, url = _start(tmp_path, port)
    try:
        more = prompt + [rng.randrange(1000, 240000) for _ in range(2 * G)]
        r = httpx.post(f"{url}/v1/shadow/sessions/s/turn", json={"prompt_ids": more}).json()
        assert r["committed"] == 5 * G and r["rolled_back_to"] is None     # restored, not reread
        httpx.post(f"{url}/v1/shadow/sessions/s/end")
        s = _wait_committed(url, "s", 7 * G)
        status = httpx.get(f"{url}/v1/shadow/status").json()
        assert status["restores"] == 1 and s["num_ids"] == len(more)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
