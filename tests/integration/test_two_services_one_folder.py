"""Two standalone services on one SHADOW_DISK folder (as on a shared file system): a scripted
agent whose turns alternate between them. After every turn the session is exact on the server
that took it, and a move reads at most one page again beyond what the folder lacked."""
import random

import pytest

httpx = pytest.importorskip("httpx")
from serving import free_port, start, stop  # noqa: E402

from evals.serve_proc import caught_up, status, turn  # noqa: E402

G = 64
NUM_TURNS = 6


def _start(tmp_path, name):
    return start({"SHADOW_GRID": str(G), "SHADOW_DISK": str(tmp_path / "disk"),
                  "SHADOW_DISK_SHARED": "1", "SHADOW_DIR": str(tmp_path / name)},
                 free_port(), timeout_s=90)


def test_turns_alternating_between_two_services_stay_exact_and_move_by_disk(tmp_path):
    rng = random.Random(37)
    servers = []
    try:
        servers = [_start(tmp_path, "a"), _start(tmp_path, "b")]
        urls = [url for _, url in servers]
        ids: list[int] = []
        committed_before = 0
        for i in range(NUM_TURNS):
            url = urls[i % 2]
            prompt = ids + [rng.randrange(1000, 240000) for _ in range(rng.randrange(40, 150))]
            output = [rng.randrange(1000, 240000) for _ in range(rng.randrange(20, 90))]
            read_before = status(url)["read_tokens"]
            turn(url, "agent", prompt, output)
            ids = prompt + output
            s = caught_up(url, "agent", len(ids), G)
            assert s["sessions"]["agent"]["num_ids"] == len(ids)
            warm = s["sessions"]["agent"]         # the router's hint: warm here, at C
            assert warm["warm_tokens"] == warm["held_tokens"] == warm["committed"]
            assert warm["num_pages_memory"] == warm["num_pages_disk"] == warm["committed"] // G
            assert s["restores"] == (i + 1) // 2  # each move restored it once from the folder
            check = httpx.get(f"{url}/v1/shadow/sessions/agent/check", timeout=120).json()
            assert check["exact"] is True and check["num_ids"] == len(ids), check
            committed = check["committed"]
            assert committed == len(ids) // G * G
            num_read = s["read_tokens"] - read_before
            # what the other server committed is on disk: read again at most one page
            assert committed - committed_before <= num_read <= committed - committed_before + G, \
                (i, committed_before, committed, num_read)
            if i:
                assert s["prefix_cache_hit_tokens"]["disk"] + \
                    s["prefix_cache_hit_tokens"]["memory"] >= committed_before - G
            committed_before = committed
        both = [status(url) for url in urls]
        # each turn after the first two found the other server's newer manifest and took it
        assert [s["superseded"] for s in both] == [(NUM_TURNS - 1) // 2, (NUM_TURNS - 2) // 2]
        assert [s["write_errors"] for s in both] == [0, 0]
        assert all(s["refusals"] == 0 for s in both)
        assert both[0]["server"]["identity"] == both[1]["server"]["identity"]
        assert both[0]["server"]["writer"] != both[1]["server"]["writer"]
    finally:
        for proc, _ in servers:
            stop(proc)
