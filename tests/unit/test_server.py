"""The HTTP API in-process (FastAPI TestClient, random:tiny): a scripted multi-turn session,
questions, status and metrics against the reader's own numbers, and bad inputs."""
import math
import time

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from helpers import rand_ids  # noqa: E402

from shadow_plugin.scheduling.scheduler import SchedulerConfig  # noqa: E402
from shadow_plugin.server.app import create_app  # noqa: E402
from shadow_plugin.server.config import ServiceConfig  # noqa: E402

G = 64
KEY = {"Authorization": "Bearer k3y"}
LOCAL = "http://127.0.0.1"    # the loopback: the Guard refuses other Host headers
OTHERS = ("shadow-idle", "shadow-history")   # threads that take the lock on their own


@pytest.fixture(scope="module")
def client():
    cfg = ServiceConfig(model="random:tiny", device="cpu", grid=G, api_key="k3y",
                        max_body_bytes=200_000, max_ids=5000,
                        scheduler=SchedulerConfig(grid=G, poll_s=0.02))
    with TestClient(create_app(cfg), base_url=LOCAL) as c:
        deadline = time.monotonic() + 60
        while c.get("/healthz").json()["state"] == "loading" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.get("/healthz").json()["state"] == "ready"
        yield c


def test_a_scripted_session(client):
    health = client.get("/healthz").json()
    assert health["stage"] == "ready"
    status = client.get("/v1/shadow/status", headers=KEY).json()
    assert status["stage"] == "ready" and 0 <= status["warm_up_s"] < 5   # CPU: no graphs
    assert status["read_path"] == "eager" == client.app.state.service.reader.adapter.path
    assert status["scheduler"]["poll_s"] == 0.02 and status["scheduler"]["idle_at_finish"]
    prompt = rand_ids(5 * G + 10, 0)
    r = client.post("/v1/shadow/sessions/s1/turn", json={"prompt_ids": prompt}, headers=KEY)
    assert r.status_code == 200 and r.json()["num_ids"] == len(prompt)
    r = client.post("/v1/shadow/sessions/s1/output", json={"ids": rand_ids(30, 1)}, headers=KEY)
    assert r.json()["num_ids"] == len(prompt) + 30
    assert client.post("/v1/shadow/sessions/s1/round", headers=KEY).status_code == 200
    assert client.post("/v1/shadow/sessions/s1/end", headers=KEY).status_code == 200
    ask = {"session": "s1", "question": "Code?", "choices": ["yes", "no"], "wait": True,
           "timeout_s": 30}
    a = client.post("/v1/shadow/ask", json=ask, headers=KEY).json()
    assert a["label"] in ("yes", "no") and abs(sum(a["probs"]) - 1) < 1e-5 and a["backlog"] < G
    b = client.post("/v1/conductor/shadow/ask", json=ask, headers=KEY).json()
    assert b["probs"] == a["probs"]
    s = client.post("/v1/shadow/summarize", json={"session": "s1", "max_tokens": 3},
                    headers=KEY).json()
    assert 1 <= len(s["ids"]) <= 3 and isinstance(s["text"], str)
    status = client.get("/v1/shadow/status", headers=KEY).json()
    reader = client.app.state.service.reader
    assert status["sessions"]["s1"]["committed"] == reader.committed("s1") == 5 * G
    assert status["last_answers"][-1]["label"] == b["label"]
    metrics = client.get("/metrics", headers=KEY).text
    st = reader.stats()
    assert reader.tails.max_tails == 8                          # SHADOW_TAILS's default
    assert st["read_tokens"] >= reader.totals["num_read_tokens"] > 0     # asks commit too
    assert f"shadow_read_tokens_total {float(st['read_tokens'])}" in metrics
    assert 'shadow_turn_starts_total{fresh="true"}' in metrics
    assert "shadow_batched_forwards_total 0.0" in metrics     # SHADOW_BATCH_SESSIONS is 1
    assert "shadow_answer_replies" not in metrics             # vLLM's endpoint's only
    from prometheus_client import CollectorRegistry, generate_latest

    from shadow_plugin.server.metrics import Collector
    registry = CollectorRegistry()                             # as the endpoint adds them
    registry.register(Collector(lambda: {**client.app.state.service.shadow.metrics(),
                                         "answer_replies": {"pushed": 3, "looked": 1}}))
    text = generate_latest(registry).decode()
    assert 'shadow_answer_replies_total{path="pushed"} 3.0' in text
    assert 'shadow_answer_replies_total{path="looked"} 1.0' in text
    assert status["totals"]["num_batched_chunks"] == 0
    assert f"shadow_prefix_cache_queried_tokens_total {float(len(prompt))}" in metrics
    assert 'shadow_prefix_cache_hit_tokens_total{tier="memory"} 0.0' in metrics
    assert 'shadow_reread_tokens_total{cause="bpe"} 0.0' in metrics
    assert f'shadow_pages{{state="pinned"}} {float(st["pages"]["pinned"])}' in metrics
    assert st["pages"]["pinned"] >= 5
    assert f"shadow_gdn_entry_bytes {float(st['gdn_entry_bytes'])}" in metrics
    for name in ("tail_hits_total", "tails_made_total", "tails_evicted_total",
                 "tails_replaced_total", "tails_held", "tail_bytes"):
        key = name.removesuffix("_total")          # grid 64: no tail is ever cut (0 each)
        assert f"shadow_{name} {float(st[key])}" in metrics
    for kind, n in st["gdn_entry_evictions"].items():           # issue 33: per kind
        assert f'shadow_gdn_entry_evictions_total{{kind="{kind}"}} {float(n)}' in metrics
    for kind, k in st["gdn_entries_by_kind"].items():
        assert f'shadow_gdn_entry_kind_bytes{{kind="{kind}"}} {float(k["bytes"])}' in metrics
    assert f"shadow_disk_bytes {float(st['disk_bytes'])}" in metrics
    for key in ("spills", "restores", "restore_ms", "drops", "refusals", "deleted_files",
                "write_errors", "gdn_entries_evicted", "pages_reused"):
        assert f"shadow_{key}_total {float(st[key])}" in metrics
    for kind in ("page", "gdn_entry"):
        for key in ("evicted_written", "evicted_already_on_disk"):
            assert f'shadow_{key}_total{{kind="{kind}"}} {float(st[key][kind])}' in metrics
    assert f"shadow_gdn_entries_not_written_total {float(st['gdn_entries_not_written'])}" \
        in metrics
    assert 'shadow_backlog_ids{session="s1"} 40.0' in metrics
    # issue 37: where s1 is warm, for a router (5 pages of 65,536 bytes; its states at C and
    # its entries of 61,440 bytes each), in status and in its own series
    s1, server = status["sessions"]["s1"], status["server"]
    assert (s1["warm_tokens"], s1["held_tokens"], s1["num_pages_memory"],
            s1["num_pages_disk"], s1["kv_bytes"]) == (5 * G, 5 * G, 5, 0, 5 * 65_536)
    assert s1["gdn_bytes"] == (1 + s1["num_gdn_entries"]) * 61_440 and s1["num_gdn_entries"]
    assert f'shadow_session_warm_tokens{{session="s1"}} {5.0 * G}' in metrics
    assert 'shadow_session_pages{session="s1",tier="memory"} 5.0' in metrics
    assert f'shadow_session_bytes{{kind="gdn",session="s1"}} {float(s1["gdn_bytes"])}' \
        in metrics
    assert (f'shadow_server_info{{disk="false",disk_shared="false",'
            f'identity="{server["identity"]}",writer="{server["writer"]}"}} 1.0') in metrics
    values = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
              if line.startswith(("shadow_ration_ms", "shadow_host_"))}
    assert values["shadow_host_decode_ms_total"] > 0                 # the turn's first output on
    assert values["shadow_host_share"] == pytest.approx(
        values["shadow_ration_ms_total"] / values["shadow_host_decode_ms_total"])
    assert reader.check_exact("s1")


@pytest.mark.parametrize("method,path,body,code", [
    ("post", "/v1/shadow/sessions/bad%20id/turn", {"prompt_ids": [1]}, 400),
    ("post", "/v1/shadow/sessions/nope/output", {"ids": [1]}, 404),
    ("post", "/v1/shadow/sessions/s2/turn", {"prompt_ids": [1, -5]}, 400),
    ("post", "/v1/shadow/sessions/s2/turn", {"prompt_ids": "abc"}, 422),
    ("post", "/v1/shadow/sessions/s2/turn", {"prompt_ids": [1], "messages": []}, 422),
    ("post", "/v1/shadow/sessions/s2/turn", {"prompt_ids": [1] * 6000}, 413),
    ("post", "/v1/shadow/ask", {"session": "nope", "question": "q", "choices": ["a", "b"]}, 404),
    ("post", "/v1/shadow/ask", {"session": "s1", "question": "q", "choices": ["a"]}, 422),
    ("post", "/v1/shadow/ask", {"session": "s1", "question": "q", "choices": ["a", "b"],
                                "at": 10**9}, 400),
    ("delete", "/v1/shadow/sessions/nope", None, 404),
    ("post", "/v1/shadow/sessions/s1/output", {"ids": ["5", True, 1.0]}, 422),
    ("post", "/v1/shadow/host", {"busy": "yes"}, 422),
    ("post", "/v1/shadow/ask", {"session": "s1", "question": "q" * 40_000,
                                "choices": ["a", "b"]}, 422),
    ("post", "/v1/shadow/ask", {"session": "s1", "question": "q", "choices": ["a", "b"],
                                "at": 10**9, "wait": True, "timeout_s": 5}, 400),
    ("post", "/v1/shadow/ask", {"session": "../x", "question": "q", "choices": ["a", "b"]}, 400),
])
def test_bad_inputs_leave_sessions_unchanged(client, method, path, body, code):
    reader = client.app.state.service.reader
    before = {s: (reader.ids(s), reader.committed(s)) for s in reader.sessions()}
    kw = {"json": body} if body is not None else {}
    r = getattr(client, method)(path, headers=KEY, **kw)
    assert r.status_code == code, r.text
    assert {s: (reader.ids(s), reader.committed(s)) for s in before} == before


def test_key_size_and_health(client):
    assert client.get("/v1/shadow/status").status_code == 401
    assert client.get("/v1/shadow/status",
                      headers={"Authorization": "bearer k3y"}).status_code == 200
    assert client.get("/healthz").status_code == 200

    def chunks():                                     # no Content-Length: a streamed body
        for _ in range(40):
            yield b" " * 10_000
    r = client.post("/v1/shadow/host", content=chunks(),
                    headers={**KEY, "content-type": "application/json"})
    assert r.status_code == 413
    big = b"[" + b"1," * 150_000 + b"1]"
    r = client.post("/v1/shadow/sessions/s3/output", content=big,
                    headers={**KEY, "content-type": "application/json"})
    assert r.status_code == 413


def test_wait_times_out_with_the_backlog(client):
    client.post("/v1/shadow/host", json={"busy": True}, headers=KEY)
    client.post("/v1/shadow/sessions/w/turn", json={"prompt_ids": rand_ids(4 * G, 5)}, headers=KEY)
    r = client.post("/v1/shadow/ask", headers=KEY, json={
        "session": "w", "question": "q", "choices": ["a", "b"], "wait": True, "timeout_s": 0.3})
    assert r.status_code == 504 and r.json()["backlog"] == 4 * G
    assert "its own turn is open (POST /v1/shadow/sessions/w/end ends it)" in r.json()["detail"]
    status = client.get("/v1/shadow/status", headers=KEY).json()
    assert "w" in status["open_turns"] and status["host_busy"] is True
    assert isinstance(status["host_busy_since"], float)      # why the backlog does not move:
    stalled = status["reading_stalled"]                       # a turn open, no round yet
    assert stalled["why"] == "turn_open" and stalled["turns"][0]["session"] == "w"
    assert stalled["turns"][0]["since_last_round_s"] is None
    # the OpenAI shape waits as ask does (it answered at once, reading what it needed,
    # ignoring wait), for one question and for a list; a summary does not wait
    chat = {"session": "w", "messages": [{"role": "user", "content": "q"}], "wait": True,
            "timeout_s": 0.3}
    for body in ({"choices": ["a", "b"]},
                 {"questions": [{"question": "q", "choices": ["a", "b"]}] * 2}):
        r = client.post("/v1/shadow/chat/completions", headers=KEY, json={**chat, **body})
        assert r.status_code == 504 and r.json()["backlog"] == 4 * G, r.text
    for body, match in (({}, "a summary does not wait"),
                        ({"choices": ["a", "b"], "timeout_s": -5}, "timeout_s")):
        r = client.post("/v1/shadow/chat/completions", headers=KEY, json={**chat, **body})
        assert r.status_code == 422 and match in r.text, r.text
    client.post("/v1/shadow/host", json={"busy": False}, headers=KEY)
    client.post("/v1/shadow/sessions/w/end", headers=KEY)
    status = client.get("/v1/shadow/status", headers=KEY).json()
    assert status["host_busy_since"] is None and status["reading_stalled"] is None
    r = client.post("/v1/shadow/chat/completions", headers=KEY,
                    json={**chat, "choices": ["a", "b"], "timeout_s": 30})
    assert r.status_code == 200 and r.json()["shadow"]["backlog"] < G, r.text


def test_service_refuses_an_empty_model():
    with pytest.raises(ValueError, match="SHADOW_MODEL is empty"):
        create_app(ServiceConfig(model=""))


def test_config_from_env(tmp_path):
    cfg = ServiceConfig.from_env({"SHADOW_MODEL": "random:tiny", "SHADOW_GB": "2",
                                  "SHADOW_DISK": str(tmp_path), "SHADOW_GRID": "1024",
                                  "SHADOW_SHARE": "0.03"})
    assert (cfg.model, cfg.resident_gb, cfg.disk_dir, cfg.grid) == ("random:tiny", 2.0,
                                                                     tmp_path, 1024)
    assert cfg.scheduler.share == 0.03 and cfg.scheduler.grid == 1024
    assert cfg.with_overrides(grid=512, model=None).scheduler.grid == 512
    with pytest.raises(ValueError, match="SHADOW_GB"):
        ServiceConfig.from_env({"SHADOW_GB": "lots"})


def test_router_in_shadow_mode_journals_at_the_insertion_point(tmp_path):
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text("coding:\n  shadow: {mode: on, router: shadow, router_min_tokens: 100}\n"
                        "quiet:\n  shadow: {mode: off}\n")
    cfg = ServiceConfig(model="random:tiny", device="cpu", grid=G, state_dir=tmp_path,
                        profiles_path=profiles, scheduler=SchedulerConfig(grid=G, poll_s=0.02))
    prompt = rand_ids(3 * G, 7) + [248046, 198] + rand_ids(G, 8) + [248046, 198, 248045, 74455, 198]
    with TestClient(create_app(cfg), base_url=LOCAL) as c:
        while c.get("/healthz").json()["state"] == "loading":
            time.sleep(0.05)
        r = c.post("/v1/shadow/sessions/r/turn", json={"prompt_ids": prompt, "profile": "coding",
                                                      "router_label": "code_edit"})
        assert r.json()["followed"] is True
        c.post("/v1/shadow/sessions/r/end")
        journal = tmp_path / "shadow.jsonl"
        deadline = time.monotonic() + 30
        while not journal.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        line = __import__("json").loads(journal.read_text().splitlines()[0])
        assert line["session"] == "r" and line["turn"] == 1 and line["router_label"] == "code_edit"
        assert line["agreement"] == (line["label"] == "code_edit")
        assert line["backlog_at_turn_start"] == 0 and 0 < line["probability"] <= 1
        status = c.get("/v1/shadow/status").json()
        assert status["router_agreement"]["total"] == 1
        assert c.post("/v1/shadow/sessions/q/turn", json={"prompt_ids": [1, 2],
                                                          "profile": "quiet"}).json() == {
            "followed": False, "first_difference": None, "rolled_back_from": None,
            "rolled_back_to": None, "backlog": None, "committed": None, "num_ids": None,
            "durable": None}
        assert c.post("/v1/shadow/sessions/q/turn", json={"prompt_ids": [1],
                                                          "profile": "nope"}).status_code == 400


def test_narrator_summarises_each_thought(tmp_path):
    profiles = tmp_path / "profiles.yaml"
    profiles.write_text("talk:\n  shadow: {mode: on, narrator: on}\n")
    cfg = ServiceConfig(model="random:tiny", device="cpu", grid=G, state_dir=tmp_path,
                        profiles_path=profiles, scheduler=SchedulerConfig(grid=G, poll_s=0.02))
    with TestClient(create_app(cfg), base_url=LOCAL) as c:
        while c.get("/healthz").json()["state"] == "loading":
            time.sleep(0.05)
        svc = c.app.state.service
        c.post("/v1/shadow/sessions/n/turn",
               json={"prompt_ids": rand_ids(2 * G, 9), "profile": "talk"})
        thought = [248068] + rand_ids(40, 10) + [248069] + rand_ids(5, 11)
        c.post("/v1/shadow/sessions/n/output", json={"ids": thought})
        assert svc.narrator.jobs[0] == ("n", 2 * G + 42)        # right after </think>
        svc.narrator.default_ms = 0.0                           # any budget covers the first job
        clock = svc.host.scheduler.clock
        svc.host.scheduler.turns["n"].first_token_s = clock() - 60.0   # a long decode so far
        c.post("/v1/shadow/sessions/n/round")
        n = c.get("/v1/shadow/sessions/n/narration").json()
        assert n["pending"] == 0 and len(n["narrations"]) == 1
        item = n["narrations"][0]
        assert item["at"] == 2 * G + 42 and isinstance(item["text"], str)
        assert svc.reader.check_exact("n")


def test_web_pages_cannot_drive_a_local_server(tmp_path):
    """Without a key: a cross-origin POST (a page may send a bodiless /end without a
    preflight) and a rebound Host are refused with 403 before any route; same-origin and
    Origin-less clients pass."""
    from shadow_plugin.server.limits import Guard
    cfg = ServiceConfig(model="random:tiny", device="cpu", grid=G, state_dir=tmp_path)
    with TestClient(create_app(cfg), base_url=LOCAL) as c:
        r = c.post("/v1/shadow/sessions/s9/end", headers={"Origin": "http://evil.example"})
        assert r.status_code == 403 and "cross-origin" in r.json()["detail"]
        r = c.post("/v1/shadow/host", json={"busy": False}, headers={"Origin": "null"})
        assert r.status_code == 403
        r = c.post("/v1/shadow/host", json={"busy": False},
                   headers={"Host": "rebound.example:8765"})
        assert r.status_code == 403 and "loopback" in r.json()["detail"]
        assert c.post("/v1/shadow/host", json={"busy": False}).status_code == 200
        r = c.post("/v1/shadow/host", json={"busy": False},
                   headers={"Origin": LOCAL})
        assert r.status_code == 200
    open_guard = Guard(None, 1024, None, allowed_hosts=None)   # bound to 0.0.0.0: any Host
    assert open_guard._foreign({b"host": b"10.0.0.5:8765"}) is None
    assert open_guard._foreign({b"host": b"10.0.0.5:8765", b"origin": b"http://x.example"})


def test_an_asks_reply_says_where_its_time_went_in_server_timing(client):
    """Server-Timing: `forward` is the answer's own ms (the largest of several questions'),
    `server` the route's time, at least that; a client's time is at least `server`."""
    client.post("/v1/shadow/sessions/st/turn", json={"prompt_ids": rand_ids(2 * G + 9, 3)},
                headers=KEY)
    for body in ({"question": "q", "choices": ["a", "b"]},
                 {"questions": [{"question": "q", "choices": ["a", "b"]},
                                {"question": "r?", "choices": ["x", "y", "z"]}]}):
        t0 = time.perf_counter()
        r = client.post("/v1/shadow/ask", headers=KEY, json={"session": "st", **body})
        client_ms = (time.perf_counter() - t0) * 1e3
        assert r.status_code == 200, r.text
        parts = dict(p.strip().split(";dur=") for p in r.headers["server-timing"].split(","))
        answers = r.json().get("answers") or [r.json()]
        assert float(parts["forward"]) == pytest.approx(max(a["ms"] for a in answers),
                                                        abs=1e-3)
        assert float(parts["forward"]) <= float(parts["server"]) <= client_ms
    client.post("/v1/shadow/sessions/st/end", headers=KEY)      # no turn left open


def test_an_ask_catches_up_one_chunk_per_lock_hold(client):
    """With a backlog, the ask's chunks are committed one per hold of the reader's lock (a
    host's call waits at most one chunk), then the answer comes with C at the line."""
    svc = client.app.state.service
    client.post("/v1/shadow/host", json={"busy": True}, headers=KEY)   # no idle reading
    client.post("/v1/shadow/sessions/cu/turn", json={"prompt_ids": rand_ids(3 * G + 7, 8)},
                headers=KEY)
    import threading
    holds = []
    lock = svc.host.lock

    class Counting:
        def __enter__(self):
            lock.acquire()
            if threading.current_thread().name not in OTHERS:     # the request's holds
                holds.append(svc.reader.committed("cu") if "cu" in svc.reader.sessions() else 0)

        def __exit__(self, *exc):
            lock.release()

    svc.host.lock = Counting()
    try:
        r = client.post("/v1/shadow/ask", headers=KEY, json={
            "session": "cu", "question": "q", "choices": ["a", "b"]})
    finally:
        svc.host.lock = lock
    assert r.status_code == 200, r.text
    # C at each hold: the ids check, the question's check, the catch-up's size (within its
    # bound), then one chunk a hold, then the ask with nothing to read
    assert holds[:7] == [0, 0, 0, 0, G, 2 * G, 3 * G] and set(holds[7:]) == {3 * G}
    assert r.json()["num_forwarded_tokens"] < 2 * G                      # the tail + question
    assert svc.reader.committed("cu") == 3 * G
    # below C: the scratch re-read from 0 to the line, one chunk a hold, then the ask
    holds.clear()
    bases = svc.reader._scratch
    base = lambda: bases["cu"].state.committed if "cu" in bases else None  # noqa: E731
    state_at = Counting.__enter__

    def enter(self):
        state_at(self)
        if threading.current_thread().name not in OTHERS:
            holds[-1] = base()
    Counting.__enter__ = enter
    svc.host.lock = Counting()
    try:
        r = client.post("/v1/shadow/ask", headers=KEY, json={
            "session": "cu", "question": "q", "choices": ["a", "b"], "at": 2 * G + 5})
    finally:
        svc.host.lock = lock
    assert r.status_code == 200, r.text
    assert holds[:7] == [None, None, None, None, G, 2 * G, 2 * G], holds
    with lock:
        want = svc.reader.ask("cu", "q", ["a", "b"], at=2 * G + 5)      # all under one hold
    assert r.json()["probs"] == list(want.probs) and "cu" not in svc.reader._scratch
    client.post("/v1/shadow/host", json={"busy": False}, headers=KEY)
    client.post("/v1/shadow/sessions/cu/end", headers=KEY)


def test_delete_leaves_the_idle_window_working(client):
    """After a DELETE the idle window still reads other sessions (a deleted session left in the
    scheduler's recency list once killed the idle loop thread for good)."""
    client.post("/v1/shadow/host", json={"busy": False}, headers=KEY)
    client.post("/v1/shadow/sessions/del-a/turn", json={"prompt_ids": rand_ids(10, 11)},
                headers=KEY)
    client.post("/v1/shadow/sessions/del-a/end", headers=KEY)
    assert client.delete("/v1/shadow/sessions/del-a", headers=KEY).status_code == 200
    assert client.delete("/v1/shadow/sessions/del-a", headers=KEY).status_code == 404
    client.post("/v1/shadow/sessions/del-b/turn", json={"prompt_ids": rand_ids(2 * G, 12)},
                headers=KEY)
    client.post("/v1/shadow/sessions/del-b/end", headers=KEY)
    r = client.post("/v1/shadow/ask", headers=KEY, json={
        "session": "del-b", "question": "q", "choices": ["a", "b"], "wait": True,
        "timeout_s": 30})
    assert r.status_code == 200 and r.json()["backlog"] == 0
    svc = client.app.state.service
    assert svc.host._thread.is_alive() and "del-a" not in svc.host.scheduler.recency


def test_a_failed_load_is_not_a_live_service(tmp_path):
    """/healthz answers 503 with the error; routes answer 503 without Retry-After."""
    (tmp_path / "nope").mkdir()                              # a directory without a model
    cfg = ServiceConfig(model=str(tmp_path / "nope"), device="cpu", grid=G, state_dir=tmp_path)
    with TestClient(create_app(cfg), base_url=LOCAL) as c:
        deadline = time.monotonic() + 30
        while c.get("/healthz").json()["state"] == "loading" and time.monotonic() < deadline:
            time.sleep(0.05)
        r = c.get("/healthz")
        assert r.status_code == 503 and r.json()["state"] == "failed" and r.json()["error"]
        r = c.post("/v1/shadow/sessions/x/turn", json={"prompt_ids": [1000, 1001]})
        assert r.status_code == 503 and "Retry-After" not in r.headers
        assert "restart" in r.json()["detail"]


@pytest.mark.parametrize("kw,match", [({"model": "random:nope"}, "no such preset"),
                                      ({"model": "/no/such/dir"}, "not a directory"),
                                      ({"model": "random:tiny", "grid": 100}, "SHADOW_GRID")])
def test_settings_refused_before_start(kw, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        create_app(ServiceConfig(state_dir=tmp_path, **kw))


@pytest.mark.parametrize("messages,match", [
    ([{"role": "wizard", "content": "x"}], r"messages\[0\].role: 'wizard'"),
    ([{"role": "user", "content": "a"}, {"role": "tool", "content": {}}],
     r"messages\[1\].content: dict given"),
    ([{"role": "user", "content": 5}], r"messages\[0\].content: int given")])
def test_bad_messages_name_the_message(client, messages, match):
    import re
    r = client.post("/v1/shadow/sessions/m1/turn", json={"messages": messages}, headers=KEY)
    assert r.status_code == 422 and re.search(match, r.text), r.text


def test_a_body_must_be_declared_json(client):
    r = client.post("/v1/shadow/sessions/ct/turn", content='{"prompt_ids": [1000]}',
                    headers={**KEY, "content-type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.json()["detail"]
    r = client.post("/v1/shadow/sessions/ct/turn", content='{"prompt_ids": [1000]}',
                    headers={**KEY, "content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200


def test_docs_page_says_where_the_openapi_document_is_when_offline(client):
    """/docs is FastAPI's Swagger UI page plus a note, shown when its CDN scripts do not load,
    linking the OpenAPI document this server serves; both need the key, as every route but
    /healthz."""
    assert client.get("/docs").status_code == 401
    page = client.get("/docs", headers=KEY)
    assert page.status_code == 200 and "swagger-ui-bundle.js" in page.text
    assert "could not be loaded from their CDN" in page.text
    assert 'href="/openapi.json"' in page.text
    doc = client.get("/openapi.json", headers=KEY)
    assert doc.status_code == 200 and "/v1/shadow/ask" in doc.json()["paths"]


def test_a_question_while_the_model_loads_gets_503_with_retry_after(tmp_path, monkeypatch):
    """While the model loads, /healthz says so and routes that need the model answer 503 with
    Retry-After; once loaded, the same call works."""
    import threading

    import shadow_plugin.server.service as service_mod
    gate, real = threading.Event(), service_mod.load_model

    def slow_load(*a, **kw):
        gate.wait(30)
        return real(*a, **kw)
    monkeypatch.setattr(service_mod, "load_model", slow_load)
    cfg = ServiceConfig(model="random:tiny", device="cpu", grid=G, state_dir=tmp_path,
                        scheduler=SchedulerConfig(grid=G, poll_s=0.02))
    with TestClient(create_app(cfg), base_url=LOCAL) as c:
        assert c.get("/healthz").json()["state"] == "loading"
        turn = ("/v1/shadow/sessions/l/turn", {"prompt_ids": [5, 6, 7]})
        r = c.post(turn[0], json=turn[1])
        assert r.status_code == 503 and r.headers["Retry-After"] == "5"
        gate.set()
        deadline = time.monotonic() + 60
        while c.get("/healthz").json()["state"] == "loading" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.post(turn[0], json=turn[1]).status_code == 200


def test_the_openai_shaped_question_sessions_and_check(client):
    """POST /v1/shadow/chat/completions answers a chat.completion: with choices the label and
    the letters' logprobs (the same probabilities as /ask), without them a summary; the
    sessions route lists positions; the check route compares with a fresh prefill."""
    client.post("/v1/shadow/sessions/oa/turn", json={"prompt_ids": rand_ids(2 * G + 3, 21)},
                headers=KEY)
    q = {"session": "oa", "messages": [{"role": "system", "content": "ignored"},
                                       {"role": "user", "content": "Is this code?"}]}
    r = client.post("/v1/shadow/chat/completions", json={**q, "choices": ["yes", "no"],
                                                          "model": "any", "temperature": 0.7},
                    headers=KEY)
    assert r.status_code == 200, r.text
    out = r.json()
    a = client.post("/v1/shadow/ask", json={"session": "oa", "question": "Is this code?",
                                            "choices": ["yes", "no"]}, headers=KEY).json()
    assert out["object"] == "chat.completion" and out["choices"][0]["message"]["content"] == \
        a["label"]
    lps = out["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert [x["token"] for x in lps] == ["A", "B"]
    assert [round(math.exp(x["logprob"]), 6) for x in lps] == [round(p, 6) for p in a["probs"]]
    timing = dict(p.strip().split(";dur=") for p in r.headers["server-timing"].split(","))
    assert float(timing["forward"]) == pytest.approx(out["shadow"]["ms"], abs=1e-3)
    assert float(timing["forward"]) <= float(timing["server"])
    assert out["model"] == f"shadow:{client.app.state.service.cfg.model}"
    s = client.post("/v1/shadow/chat/completions", json={**q, "max_tokens": 3},
                    headers=KEY)
    assert "server-timing" not in s.headers             # a summary: no question's timing
    s = s.json()
    assert s["model"] == out["model"]
    assert isinstance(s["choices"][0]["message"]["content"], str)
    assert 1 <= s["usage"]["completion_tokens"] <= 3 and s["choices"][0]["logprobs"] is None
    bad = client.post("/v1/shadow/chat/completions", headers=KEY,
                      json={"session": "oa", "messages": [{"role": "system", "content": "x"}]})
    assert bad.status_code == 422 and "last user message" in bad.text
    assert client.post("/v1/shadow/chat/completions", headers=KEY,
                       json={**q, "session": "nobody"}).status_code == 404
    listed = client.get("/v1/shadow/sessions", headers=KEY).json()["sessions"]
    assert listed["oa"]["num_ids"] == 2 * G + 3
    check = client.get("/v1/shadow/sessions/oa/check", headers=KEY).json()
    assert check["exact"] is True and check["committed"] % G == 0 and check["error"] is None
    assert check["moved"] is False and check["num_ids"] == 2 * G + 3
    assert client.get("/v1/shadow/sessions/nobody/check", headers=KEY).status_code == 404


@pytest.mark.parametrize("part", [{"type": "text", "text": 7}, {"type": "text", "text": None},
                                  {"type": "text", "text": ["x"]}, {"type": "text", "text": {}},
                                  {"type": "text", "text": True}, 7, None, "x", [1]])
def test_a_chat_content_part_of_any_json_type_is_a_4xx_naming_it(client, part):
    """Issue 34: a part whose text is not a string was a 500 that dropped the connection."""
    client.post("/v1/shadow/sessions/parts/turn", headers=KEY, json={"prompt_ids": [1000, 1001]})
    r = client.post("/v1/shadow/chat/completions", headers=KEY, json={
        "session": "parts", "messages": [{"role": "user", "content": [part]}]})
    assert r.status_code == 422, r.text
    assert "messages[0].content[0]" in r.json()["detail"]
    assert client.get("/v1/shadow/status", headers=KEY).status_code == 200   # still served


def test_a_list_of_questions_is_answered_in_order_as_each_alone(client):
    """POST /v1/shadow/ask with `questions`: the answers in order, each with the probabilities
    the same question gets alone; the single-question body unchanged; the OpenAI-shaped route
    takes the list as an extension (choice i answers questions[i]) and `n` as n equal
    choices."""
    client.post("/v1/shadow/sessions/qs/turn", json={"prompt_ids": rand_ids(3 * G + 5, 31)},
                headers=KEY)
    items = [{"question": "Is this code?", "choices": ["yes", "no"]},
             {"question": "Which kind of turn is this?", "choices": ["chat", "edit", "debug"]},
             {"question": "Is the user upset?", "choices": ["yes", "no", "unsure"]}]
    r = client.post("/v1/shadow/ask", json={"session": "qs", "questions": items}, headers=KEY)
    assert r.status_code == 200, r.text
    answers = r.json()["answers"]
    assert len(answers) == 3
    for item, got in zip(items, answers):
        alone = client.post("/v1/shadow/ask", json={"session": "qs", **item},
                            headers=KEY).json()
        assert got["probs"] == alone["probs"] and got["label"] == alone["label"]
    assert len(answers[1]["probs"]) == 3
    chat = client.post("/v1/shadow/chat/completions", headers=KEY,
                       json={"session": "qs", "questions": items, "model": "any"}).json()
    assert [c["index"] for c in chat["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in chat["choices"]] == [a["label"] for a in answers]
    assert [a["probs"] for a in chat["shadow"]["answers"]] == [a["probs"] for a in answers]
    one = {"session": "qs", "messages": [{"role": "user", "content": "Is this code?"}],
           "choices": ["yes", "no"]}
    n3 = client.post("/v1/shadow/chat/completions", headers=KEY, json={**one, "n": 3}).json()
    assert [c["index"] for c in n3["choices"]] == [0, 1, 2]
    assert len({str(c["logprobs"]) for c in n3["choices"]}) == 1
    assert n3["choices"][0]["message"]["content"] == answers[0]["label"]
    s2 = client.post("/v1/shadow/chat/completions", headers=KEY,
                     json={**one, "choices": None, "max_tokens": 2, "n": 2}).json()
    assert len(s2["choices"]) == 2 and s2["choices"][0]["message"] == s2["choices"][1]["message"]


@pytest.mark.parametrize("body,code,match", [
    ({"questions": []}, 422, "at least 1"),
    ({"questions": [{"question": "q", "choices": ["a", "b"]}] * 9}, 400,
     "SHADOW_MAX_QUESTIONS"),
    ({"questions": [{"question": "q", "choices": ["a"]}]}, 422, "questions.0.choices"),
    ({"questions": [{"question": "q", "choices": ["a", "b"]}], "question": "q",
      "choices": ["a", "b"]}, 422, "not both"),
    ({"question": "q"}, 422, "both question and choices"),
    ({}, 422, "neither was given"),
    ({"questions": [{"question": "q", "choices": ["a", "b"], "extra": 1}]}, 422, "extra"),
    # refused by the reader's own checks, before the session's backlog is read
    ({"questions": [{"question": "ok", "choices": ["a", "b"]},
                    {"question": "x", "choices": ["a", "a"]}]}, 400,
     "questions[1]: choices[1] = 'a' repeats an earlier choice"),
    ({"questions": [{"question": "   ", "choices": ["a", "b"]}]}, 400,
     "questions[0]: question must not be empty"),
    ({"question": "   ", "choices": ["a", "b"]}, 400, "question must not be empty"),
])
def test_bad_question_lists_get_a_4xx_naming_what_is_wrong(client, body, code, match):
    client.post("/v1/shadow/sessions/ql/turn", json={"prompt_ids": rand_ids(2 * G, 32)},
                headers=KEY)
    reader = client.app.state.service.reader
    before = reader.committed("ql")
    r = client.post("/v1/shadow/ask", json={"session": "ql", **body}, headers=KEY)
    assert r.status_code == code and match in r.text, r.text
    assert reader.committed("ql") == before


@pytest.mark.parametrize("kind", ["one", "many", "summary"])
def test_a_question_past_the_limit_reads_nothing(client, monkeypatch, kind):
    """413 for a question (or a summary's instruction) rendering past max_question_tokens,
    before the backlog is read."""
    service = client.app.state.service
    monkeypatch.setattr(service.shadow, "max_question_tokens", 40)
    session = f"qt-{kind}"
    client.post(f"/v1/shadow/sessions/{session}/turn", json={"prompt_ids": rand_ids(3 * G, 33)},
                headers=KEY)
    long_q = {"question": "word " * 60, "choices": ["a", "b"]}
    route, body = {
        "one": ("ask", long_q),
        "many": ("ask", {"questions": [{"question": "q", "choices": ["a", "b"]}, long_q]}),
        "summary": ("summarize", {"instruction": "word " * 60, "max_tokens": 4})}[kind]
    r = client.post(f"/v1/shadow/{route}", json={"session": session, **body}, headers=KEY)
    assert r.status_code == 413 and r.json()["limit"] == 40 and r.json()["num_ids"] > 60, r.text
    assert service.reader.committed(session) == 0


@pytest.mark.parametrize("extra,match", [
    ({"n": 2}, "n is their count"),
    ({"choices": ["a", "b"]}, "leave out choices"),
])
def test_bad_openai_batches_are_refused(client, extra, match):
    r = client.post("/v1/shadow/chat/completions", headers=KEY, json={
        "session": "qs", "questions": [{"question": "q", "choices": ["a", "b"]}] * 3, **extra})
    assert r.status_code == 422 and match in r.text, r.text
    r = client.post("/v1/shadow/chat/completions", headers=KEY, json={"session": "qs"})
    assert r.status_code == 422 and "give messages" in r.text


@pytest.mark.parametrize("at", [-1, 2 * G + 1, "3", 2.0, True])
def test_a_fork_position_outside_the_ids_or_not_an_integer_is_refused_first(client, at):
    """Shadow.fork_position (where a question or summary forks, before its catch-up reads
    anything): an `at` below 0, past the ids, or not an integer is a ValueError naming it, and
    the session's state is as it was."""
    svc = client.app.state.service
    client.post("/v1/shadow/host", json={"busy": True}, headers=KEY)   # no idle reading
    client.post("/v1/shadow/sessions/fp/turn", json={"prompt_ids": rand_ids(2 * G, 9)},
                headers=KEY)
    try:
        before = svc.shadow.position("fp")
        assert svc.shadow.fork_position("fp", None) == 2 * G
        assert svc.shadow.fork_position("fp", G + 3) == G + 3
        with pytest.raises(ValueError, match=r"at = .*(outside the session's ids \[0, 128\]|"
                                             r"must be an integer position)"):
            svc.shadow.fork_position("fp", at)
        assert svc.shadow.position("fp") == before
    finally:
        client.post("/v1/shadow/host", json={"busy": False}, headers=KEY)
        client.post("/v1/shadow/sessions/fp/end", headers=KEY)
