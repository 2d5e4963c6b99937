"""Two standalone services on one SHADOW_DISK folder (as on a shared file system): a scripted
agent whose turns alternate between them. After every turn the session is exact on the server
that took it, and a move reads at most one page again beyond what the folder lacked."""
import random
import time

import pytest

httpx = pytest.importorskip("httpx")
from serving import free_port, start, stop  # noqa: E402

G = 64
NUM_TURNS = 6


def _start(tmp_path, name):
    return start({"SHADOW_GRID": str(G), "SHADOW_DISK": str(tmp_path / "disk"),
                  "SHADOW_DISK_SHARED": "1", "SHADOW_DIR": str(tmp_path / name)},
                 free_port(), timeout_s=90)


def _status(url):
    return httpx.get(f"{url}/v1/shadow/status", timeout=30).json()


def _caught_up(url, sid, num_ids):
    """The server's status once it has read every whole page of the session's ids."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        s = _status(url)
        if s["sessions"].get(sid, {}).get("committed", -1) >= num_ids // G * G:
            return s
        time.sleep(0.05)
    raise AssertionError(f"{url} did not read {sid} up to {num_ids // G * G}")


def _turn(url, sid, prompt, output):
    r = httpx.post(f"{url}/v1/shadow/sessions/{sid}/turn", json={"prompt_ids": prompt},
                   timeout=60)
    assert r.status_code == 200, r.text
    r = httpx.post(f"{url}/v1/shadow/sessions/{sid}/output",
                   json={"ids": output, "position": len(prompt)}, timeout=60)
    assert r.status_code == 200, r.text
    r = httpx.post(f"{url}/v1/shadow/sessions/{sid}/end", timeout=60)
    assert r.status_code == 200, r.text


def test_turns_alternating_between_two_services_stay_exact_and_move_by_disk(tmp_path):
    rng = random.Random(37)
    servers = []
    try:
        servers = [_start(tmp_path, "a"), _start(tmp_path, "b")]
        urls = [url for _, url in servers]
        ids: list[int] = []
        committed_before = 0
        for turn in range(NUM_TURNS):
            url = urls[turn % 2]
            prompt = ids + [rng.randrange(1000, 240000) for _ in range(rng.randrange(40, 150))]
            output = [rng.randrange(1000, 240000) for _ in range(rng.randrange(20, 90))]
            read_before = _status(url)["read_tokens"]
            _turn(url, "agent", prompt, output)
            ids = prompt + output
            s = _caught_up(url, "agent", len(ids))
            assert s["sessions"]["agent"]["num_ids"] == len(ids)
            check = httpx.get(f"{url}/v1/shadow/sessions/agent/check", timeout=120).json()
            assert check["exact"] is True and check["num_ids"] == len(ids), check
            committed = check["committed"]
            assert committed == len(ids) // G * G
            num_read = s["read_tokens"] - read_before
            # what the other server committed is on disk: read again at most one page
            assert committed - committed_before <= num_read <= committed - committed_before + G, \
                (turn, committed_before, committed, num_read)
            if turn:
                assert s["prefix_cache_hit_tokens"]["disk"] + \
                    s["prefix_cache_hit_tokens"]["memory"] >= committed_before - G
            committed_before = committed
        status = [_status(url) for url in urls]
        # each turn after the first two found the other server's newer manifest and took it
        assert [s["superseded"] for s in status] == [(NUM_TURNS - 1) // 2, (NUM_TURNS - 2) // 2]
        assert [s["write_errors"] for s in status] == [0, 0]
        assert all(s["refusals"] == 0 for s in status)
    finally:
        for proc, _ in servers:
            stop(proc)
