"""Edges a review of issue 19 found: a waiting ask through a remote door (vLLM's) never calls the
door on the event loop's thread; a turn whose profile is off drops what the session held; an
end after a park whose write failed writes the manifest; a question whose client left still
counts in the pool until it ends; a manifest with a damaged body is listed under its session's
name, across restarts, even once touched; a capped session takes the host's positions."""
import asyncio
import random
import threading
import time

import pytest

pytest.importorskip("fastapi")
from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from shadow_plugin.reader.reader import Reader  # noqa: E402
from shadow_plugin.server import errors  # noqa: E402
from shadow_plugin.server.ask_pool import AskPool  # noqa: E402
from shadow_plugin.server.remote import RemoteService  # noqa: E402
from shadow_plugin.server.routes import question_router  # noqa: E402

G = 64


def test_a_waiting_ask_never_calls_a_remote_door_on_the_event_loop():
    calls = []

    def call(name, kwargs):
        try:                                  # the event loop's thread: vLLM's would hang
            asyncio.get_running_loop()
            raise AssertionError(f"{name} called on the event loop's thread")
        except RuntimeError:
            pass
        calls.append(name)
        answers = {"status": {"grid": G, "model": "m"}, "fork_position": 300,
                   "positions": {"s": [300, 0]}, "not_reading_why": "open turns"}
        return ("ok", answers[name])

    app = FastAPI()
    app.include_router(question_router(RemoteService(call), AskPool(1, 1)))
    with TestClient(app) as c:
        r = c.post("/v1/shadow/ask", json={"session": "s", "question": "q",
                                           "choices": ["a", "b"], "wait": True,
                                           "timeout_s": 0.5})
    assert r.status_code == 504 and r.json()["backlog"] == 300, r.text
    assert "status" in calls and "positions" in calls
    with TestClient(app) as c:               # issue 34: a wait shorter than the first look
        r = c.post("/v1/shadow/ask", json={"session": "s", "question": "q",
                                           "choices": ["a", "b"], "wait": True,
                                           "timeout_s": 0.001})
    assert r.status_code == 504 and (r.json()["backlog"], r.json()["committed"]) == (300, 0)
    assert "300 ids were still unread after the 0.001 s waited" in r.json()["detail"]


def test_a_question_whose_client_left_counts_until_it_ends():
    pool, release = AskPool(1, 0), threading.Event()

    def slow(cancelled):
        release.wait(10)
        return "done"

    async def run():
        gone = asyncio.Event()

        async def disconnected():
            return gone.is_set()

        first = asyncio.create_task(pool.run(slow, disconnected=disconnected))
        await asyncio.sleep(0.05)
        gone.set()
        with pytest.raises(errors.ClientGone):
            await first
        assert pool.num_in == 1                    # still running in its worker
        with pytest.raises(errors.Busy):
            await pool.run(slow)
        release.set()
        for _ in range(100):
            if pool.num_in == 0:
                break
            await asyncio.sleep(0.02)
        assert pool.num_in == 0
        assert await pool.run(lambda cancelled: "next") == "next"

    asyncio.run(run())


def test_an_end_after_a_failed_park_writes_the_manifest(tiny, tmp_path, monkeypatch):
    import block_store.residency as residency
    r = Reader(tiny, grid=G, disk_dir=tmp_path)
    r.feed("s", list(range(1000, 1000 + 2 * G + 3)), "prompt")
    r.table.store.disk.manifest_path("s").unlink()
    real = residency.save_session

    def full(*args, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(residency, "save_session", full)
    r.table.park("s")
    assert r.stats()["sessions"]["s"]["residency"] == "dropped"
    monkeypatch.setattr(residency, "save_session", real)
    assert r.save("s") is True                     # the disk is back: written now
    assert Reader(tiny, grid=G, disk_dir=tmp_path).ids("s") == list(range(1000, 1000 + 2 * G + 3))


def test_a_damaged_body_is_listed_by_name_across_restarts(tiny, tmp_path):
    a = Reader(tiny, grid=G, disk_dir=tmp_path)
    a.feed("x", list(range(2000, 2000 + G + 5)), "prompt")
    path = a.table.store.disk.manifest_path("x")
    path.write_bytes(path.read_bytes()[:-40])      # a truncated body, its header intact
    for _ in range(2):
        b = Reader(tiny, grid=G, disk_dir=tmp_path)
        (listed,) = b.stats()["refused_sessions"]
        assert listed["session"] == "x" and not listed["reason"].count("unreadable: unread")
        with pytest.raises(KeyError, match="refused at start-up"):
            b.position("x")                        # touched: still listed, still there
        assert path.is_file()


def test_off_profiles_and_capped_sessions_over_http(tmp_path):
    from shadow_plugin.scheduling.scheduler import SchedulerConfig
    from shadow_plugin.server.app import create_app
    from shadow_plugin.server.config import ServiceConfig
    profiles = tmp_path / "p.yaml"
    profiles.write_text("quiet:\n  shadow:\n    mode: off\n")
    cfg = ServiceConfig(model="random:tiny", device="cpu", grid=G, state_dir=tmp_path,
                        profiles_path=profiles, max_positions_policy="cap",
                        max_ids=300_000, max_body_bytes=8 * 2**20,
                        scheduler=SchedulerConfig(grid=G, poll_s=0.02))
    with TestClient(create_app(cfg), base_url="http://127.0.0.1") as c:
        deadline = time.monotonic() + 60
        while c.get("/healthz").json()["state"] == "loading" and time.monotonic() < deadline:
            time.sleep(0.05)
        base = "/v1/shadow/sessions"
        assert c.post(f"{base}/k/turn", json={"prompt_ids": list(range(1000, 1100))}).json()[
            "num_ids"] == 100
        r = c.post(f"{base}/k/turn", json={"prompt_ids": [5, 6], "profile": "quiet"})
        assert r.json()["followed"] is False
        r = c.post(f"{base}/k/output", json={"ids": [7, 8]})   # not onto the old prompt
        assert r.status_code == 200 and r.json()["followed"] is False
        assert c.get(f"{base}/k/narration").status_code == 404
        n = 262_144 + 10
        ids = [random.Random(0).randrange(1000, 9000) for _ in range(n)]
        r = c.post(f"{base}/big/turn", json={"prompt_ids": ids})
        assert r.status_code == 200 and r.json()["num_ids"] == 262_144
        r = c.post(f"{base}/big/output", json={"ids": [5], "position": n})
        assert r.status_code == 200 and r.json()["num_ids"] == 262_144
        r = c.post(f"{base}/big/output", json={"ids": [5], "position": 3})
        assert r.status_code == 409


def test_a_remote_question_is_looked_for_soon_then_less_often(monkeypatch):
    """remote.run: the waits between looks for a ticket's result double from the first up to
    the longest, so a quick question is not held for the longest wait."""
    from shadow_plugin.server import remote
    waits, replies = [], iter([("ticket", 7)] + [("pending", None)] * 7 + [("ok", 42)])
    monkeypatch.setattr(remote.time, "sleep", waits.append)
    calls = []

    def call(name, kwargs):
        calls.append((name, kwargs))
        return next(replies)

    assert remote.run(call, "ask", {"q": 1}, poll_s=0.02, first_poll_s=0.001) == 42
    assert waits == [0.001, 0.002, 0.004, 0.008, 0.016, 0.02, 0.02]
    assert calls[0] == ("ask", {"q": 1})
    assert calls[1:] == [("result", {"ticket": 7, "wait_s": remote.RESULT_WAIT_S})] * 8


def test_a_remote_question_whose_other_side_waited_is_looked_for_again_at_once(monkeypatch):
    """remote.run: a ("pending", True) reply (the other side waited for the result: its host
    idle) is followed by the next look at once, no wait here; ("pending", False) (its host
    busy) by the doubling waits."""
    from shadow_plugin.server import remote
    waits = []
    monkeypatch.setattr(remote.time, "sleep", waits.append)
    replies = iter([("ticket", 3), ("pending", True), ("pending", True), ("pending", False),
                    ("pending", False), ("pending", True), ("ok", "answer")])
    assert remote.run(lambda name, kw: next(replies), "ask", {}, first_poll_s=0.001) == "answer"
    assert waits == [0.001, 0.002]


def test_an_engines_result_call_waits_for_the_answer_only_while_its_host_is_idle():
    """EmbeddedShadow._result: with the host idle it waits up to wait_s (capped) for the
    question and answers as soon as it is done; with the host busy it answers pending at once;
    an unknown ticket is a KeyError reply."""
    import concurrent.futures
    import threading
    import time
    from types import SimpleNamespace

    from shadow_plugin.engine import embedded
    pool = concurrent.futures.ThreadPoolExecutor(1)
    go = threading.Event()
    job = pool.submit(lambda: go.wait(5) and ("ok", 1))
    shadow = SimpleNamespace(_jobs={9: job}, service=SimpleNamespace(busy=True))
    t0 = time.monotonic()
    assert embedded.EmbeddedShadow._result(shadow, 9, 0.5) == ("pending", False)
    assert time.monotonic() - t0 < 0.05                       # busy: no wait
    shadow.service.busy = False
    t0 = time.monotonic()
    assert embedded.EmbeddedShadow._result(shadow, 9, 10.0) == ("pending", True)
    assert embedded.RESULT_WAIT_MAX_S <= time.monotonic() - t0 < 1.0     # capped
    threading.Timer(0.005, go.set).start()
    assert embedded.EmbeddedShadow._result(shadow, 9, 0.5) == ("ok", 1)   # done within
    assert 9 not in shadow._jobs
    assert embedded.EmbeddedShadow._result(shadow, 9, 0.5)[:2] == ("error", "KeyError")
    assert embedded.EmbeddedShadow._result(shadow, 8, "x")[:2] == ("error", "KeyError")
    pool.shutdown()


def test_an_engines_result_call_never_waits_for_a_question_still_queued():
    """EmbeddedShadow._result with the host idle: the questions run one at a time in the
    question thread, so a look for one still queued behind another cannot end within the
    wait: it answers ("pending", False) at once (the API side backs off), and the engine's
    loop, which runs every look, is held by at most the running question's look (a new host
    request waits behind each look). A wait_s of any size or type never raises."""
    import concurrent.futures
    import threading
    import time
    from types import SimpleNamespace

    from shadow_plugin.engine import embedded
    pool = concurrent.futures.ThreadPoolExecutor(1)
    go = threading.Event()
    running = pool.submit(lambda: go.wait(5) and ("ok", 1))
    queued = pool.submit(lambda: ("ok", 2))
    shadow = SimpleNamespace(_jobs={1: running, 2: queued}, service=SimpleNamespace(busy=False))
    t0 = time.monotonic()
    assert embedded.EmbeddedShadow._result(shadow, 2, 0.5) == ("pending", False)
    assert time.monotonic() - t0 < 0.005                      # queued: no wait
    for wait_s in (10 ** 400, float("inf"), float("nan"), -1, True, "1", None):
        assert embedded.EmbeddedShadow._result(shadow, 2, wait_s)[0] == "pending", wait_s
    go.set()
    assert embedded.EmbeddedShadow._result(shadow, 1, 0.5) == ("ok", 1)
    assert embedded.EmbeddedShadow._result(shadow, 2, 0.5) == ("ok", 2)
    pool.shutdown()


def test_an_ask_without_a_wait_is_a_404_or_400_at_once_when_the_pool_is_taken():
    """An ask without `wait` takes its position in the answer's own call (one call to a remote
    door's engine); with every worker taken the route checks the position first, so an
    unknown session is a 404 and an `at` past the ids a 400 at once, neither queued behind
    the running question nor the pool's 429 once the queue is full too; with a free worker,
    no call but the answer's."""
    release, calls = threading.Event(), []
    answer = {"label": "a", "letter": "A", "probs": [1.0, 0.0], "ms": 1.0, "backlog": 0,
              "num_forwarded_tokens": 1, "num_committed": 300, "at": 300,
              "beyond_max_positions": False, "stale": False}

    def call(name, kwargs):
        calls.append((name, kwargs.get("session"), kwargs.get("fork_at")))
        if name == "status":
            return ("ok", {"grid": G, "model": "m"})
        if kwargs.get("session") == "zz":
            return ("error", "KeyError", ("unknown session 'zz'",))
        if kwargs.get("at") is not None and kwargs["at"] > 300:
            return ("error", "ValueError", (f"at = {kwargs['at']} is outside [0, 300]",))
        if name == "fork_position":
            return ("ok", 300)
        release.wait(10)
        return ("ok", answer)

    def in_flight(n):
        for _ in range(500):
            if calls.count(("ask", "s", None)) + calls.count(("ask", "s", 300)) >= n:
                return
            time.sleep(0.01)

    app = FastAPI()
    app.include_router(question_router(RemoteService(call), AskPool(1, 1)))
    body = {"session": "s", "question": "q", "choices": ["a", "b"]}
    with TestClient(app) as c:
        threads = [threading.Thread(target=lambda: c.post("/v1/shadow/ask", json=body))
                   for _ in range(2)]
        threads[0].start()
        in_flight(1)
        assert calls == [("ask", "s", None)]     # the answer's call only, its position in it
        t0 = time.monotonic()
        r = c.post("/v1/shadow/ask", json={**body, "session": "zz"})     # the queue is free
        assert r.status_code == 404 and r.json()["detail"] == "unknown session 'zz'", r.text
        r = c.post("/v1/shadow/ask", json={**body, "at": 10**6})
        assert r.status_code == 400 and "outside" in r.json()["detail"], r.text
        assert time.monotonic() - t0 < 5                # not after the running question
        threads[1].start()                              # queued: the pool is full now
        for _ in range(500):
            if ("fork_position", "s", None) in calls:
                break
            time.sleep(0.01)
        time.sleep(0.1)
        r = c.post("/v1/shadow/ask", json={**body, "session": "zz"})
        assert r.status_code == 404, r.text
        r = c.post("/v1/shadow/ask", json={"session": "zz", "questions": [
            {"question": "q", "choices": ["a", "b"]}]})
        assert r.status_code == 404, r.text
        r = c.post("/v1/shadow/ask", json=body)
        assert r.status_code == 429 and "SHADOW_ASK_WORKERS=1" in r.json()["detail"], r.text
        release.set()
        for t in threads:
            t.join(10)
        calls.clear()
        r = c.post("/v1/shadow/ask", json=body)
        assert r.status_code == 200 and r.json()["probs"] == [1.0, 0.0], r.text
    assert calls == [("ask", "s", None)]
