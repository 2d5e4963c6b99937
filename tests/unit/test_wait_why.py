"""Issue 34, item 5: a waiting ask's 504 says what is held and why. A wait whose line C has
reached answers (a tiny timeout_s was a 504 with `backlog: 0, committed: 0` naming another
session's open turn while the session held C = 640 and a backlog of 60, below a chunk); a 504
gives the session's backlog and C as held and the reason that holds for it: its own open turn,
other sessions' open turns, the host's busy signal, or the idle window reading other sessions
first. In process (TestClient, random:tiny, seeded), the idle loop held still (a poll an hour
apart, none at a turn's end) so the positions are what the test made them."""
import threading
import time

import pytest
from helpers import rand_ids  # noqa: E402

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from shadow_plugin.scheduling.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from shadow_plugin.server import waits  # noqa: E402
from shadow_plugin.server.app import create_app  # noqa: E402
from shadow_plugin.server.config import ServiceConfig  # noqa: E402
from shadow_plugin.server.facade import not_read_why  # noqa: E402

G = 64


def _ask(c: TestClient, session: str, timeout_s: float):
    return c.post("/v1/shadow/ask", json={"session": session, "question": "q", "wait": True,
                                          "choices": ["a", "b"], "timeout_s": timeout_s})


def test_a_504_reports_this_sessions_position_and_the_reason_that_holds_for_it(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr(waits, "WHY_FRESH_S", 0.0)    # each 504 looks afresh
    cfg = ServiceConfig(model="random:tiny", device="cpu", grid=G, state_dir=tmp_path,
                        scheduler=SchedulerConfig(grid=G, poll_s=3600, idle_at_finish=False))
    with TestClient(create_app(cfg), base_url="http://127.0.0.1") as c:
        while c.get("/healthz").json()["state"] != "ready":
            pass
        c.post("/v1/shadow/sessions/a/turn", json={"prompt_ids": rand_ids(10 * G + 60, 1)})
        c.post("/v1/shadow/sessions/a/end")
        r = c.post("/v1/shadow/ask", json={"session": "a", "question": "q",
                                           "choices": ["a", "b"]})   # reads it to its line
        assert r.status_code == 200 and r.json()["backlog"] == 60
        c.post("/v1/shadow/sessions/c/turn", json={"prompt_ids": rand_ids(3 * G + 5, 3)})
        c.post("/v1/shadow/sessions/b/turn", json={"prompt_ids": rand_ids(2 * G + 1, 2)})

        # the trial's case: C = 640 is a's line already, whatever another session does
        r = _ask(c, "a", 0.001)
        assert r.status_code == 200 and r.json()["backlog"] == 60, r.text

        r = _ask(c, "c", 0.2)                       # its own turn is open
        assert r.status_code == 504
        body = r.json()
        assert (body["backlog"], body["committed"]) == (3 * G + 5, 0)
        assert f"{3 * G + 5} ids were still unread after the 0.2 s waited" in body["detail"]
        assert "its own turn is open (POST /v1/shadow/sessions/c/end ends it)" \
            in body["detail"] and "other open turns: b" in body["detail"]

        c.post("/v1/shadow/sessions/c/end")         # b's turn holds the idle window
        r = _ask(c, "c", 0.001)
        assert r.status_code == 504 and r.json()["backlog"] == 3 * G + 5
        assert r.json()["detail"].endswith(
            "the idle window waits for other sessions' open turns to end (POST .../end): b")

        c.post("/v1/shadow/host", json={"busy": True})
        c.post("/v1/shadow/sessions/b/end")
        r = _ask(c, "c", 0.001)
        assert r.status_code == 504 and "the host reports busy" in r.json()["detail"]

        c.post("/v1/shadow/host", json={"busy": False})  # free: b (more recent) comes first
        r = _ask(c, "c", 0.001)
        assert r.status_code == 504 and r.json()["committed"] == 0
        assert "the idle window reads 1 other sessions first (b: 2 chunks), then its 3 " \
               "chunks (about " in r.json()["detail"], r.text


def test_a_wait_whose_session_is_cut_below_at_gets_a_400_at_once(tmp_path):
    """A turn that rewrites the session shorter than a waiting ask's `at` ends the wait with
    the 400 the ask would get (it was a 504 at the wait's end)."""
    cfg = ServiceConfig(model="random:tiny", device="cpu", grid=G, state_dir=tmp_path,
                        scheduler=SchedulerConfig(grid=G, poll_s=3600, idle_at_finish=False))
    with TestClient(create_app(cfg), base_url="http://127.0.0.1") as c:
        while c.get("/healthz").json()["state"] != "ready":
            pass
        ids = rand_ids(800, 4)
        c.post("/v1/shadow/sessions/w/turn", json={"prompt_ids": ids})   # open: not read
        got = {}

        def ask():
            t0 = time.monotonic()
            got["r"] = c.post("/v1/shadow/ask", json={
                "session": "w", "question": "q", "choices": ["a", "b"], "at": 700,
                "wait": True, "timeout_s": 20})
            got["s"] = time.monotonic() - t0
        t = threading.Thread(target=ask)
        t.start()
        time.sleep(0.5)                               # the ask waits
        c.post("/v1/shadow/sessions/w/turn", json={"prompt_ids": ids[:300]})
        t.join(30)
        r = got["r"]
        assert r.status_code == 400, r.text
        assert "at = 700 is outside the session's ids [0, 300]" in r.text
        assert got["s"] < 10


def test_the_reasons_text():
    assert not_read_why("s", 3, [], False, {}, 20.0) == \
        "the idle window is reading it: 3 chunks were left (about 0.1 s at the reader's 20 " \
        "ms a chunk)"
    assert not_read_why("s", 3, [], False, {"x": 1, "y": 4}, None) == \
        "the idle window reads 2 other sessions first (x, y: 5 chunks), then its 3 chunks"
    assert not_read_why(None, 0, [f"t{i}" for i in range(7)], False, {}, None) == \
        "the idle window waits for other sessions' open turns to end (POST .../end): " \
        "t0, t1, t2, t3, t4 and 2 more"


class _Port:
    """A scheduler's reader port over fixed (ids, C) positions."""

    def __init__(self, pos: dict[str, tuple[int, int]]):
        self.pos = pos

    def backlog(self, s):
        n, c = self.pos.get(s, (0, 0))
        return n - c

    def committed(self, s):
        return self.pos.get(s, (0, 0))[1]


def test_the_sessions_the_idle_window_reads_first():
    port = _Port({"old": (5 * G, 0), "mid": (G - 1, 0), "new": (3 * G, G), "q": (4 * G, 0)})
    sched = Scheduler(SchedulerConfig(grid=G), port, clock=lambda: 0.0,
                      host_busy=lambda: False, cost=None)
    sched.recency = ["q", "old", "mid", "new"]
    assert sched.ahead_of("old") == ["new"]                 # mid: less than a chunk
    assert sched.ahead_of("new") == [] and sched.ahead_of("gone") == ["new", "old", "q"]
    sched.questions = [("q", 3 * G + 5)]                   # a question's session: first
    assert sched.ahead_of("old") == ["q", "new"] and sched.ahead_of("q") == []
