"""The service's one lock: routes and the idle loop at once on a real server (loopback, seeded
and bounded loops) with a cap small enough that sessions spill, then every session exact and
holding exactly the ids the clients sent; existence checks restore nothing."""
import random
import threading

import httpx
import pytest
from serving import Server  # noqa: E402

from shadow_plugin.scheduling.scheduler import SchedulerConfig
from shadow_plugin.server.config import ServiceConfig

G = 64
SESSION_MB = 0.4         # random:tiny, 3G + 5 ids read: 3 pages of 64 KiB, GDN states and
                         # entries: 0.36 MiB resident (measured)


def _cfg(tmp_path, resident_mb: float) -> ServiceConfig:
    return ServiceConfig(model="random:tiny", device="cpu", grid=G, state_dir=tmp_path / "state",
                         resident_gb=resident_mb / 1024, disk_dir=tmp_path / "disk",
                         scheduler=SchedulerConfig(grid=G, poll_s=0.02, idle_burst_s=0.2))



def _client_loop(url: str, seed: int, sent: dict, errors: list, num_ops: int = 24) -> None:
    """Seeded host events and questions on two sessions of one client; `sent` gets the ids each
    session should hold (prompts as served, outputs appended)."""
    rng = random.Random(seed)
    names = [f"c{seed}-{k}" for k in range(2)]
    held = {s: [] for s in names}
    with httpx.Client(base_url=url, timeout=60) as c:
        for s in names:
            held[s] = [rng.randrange(1000, 240000) for _ in range(rng.randrange(70, 200))]
            _ok(c.post(f"/v1/shadow/sessions/{s}/turn", json={"prompt_ids": held[s]}), errors)
        for _ in range(num_ops):
            s = rng.choice(names)
            op = rng.choice(["turn", "rewrite", "output", "output", "round", "end", "ask",
                             "status", "narration", "metrics"])
            if op in ("turn", "rewrite"):
                cut = rng.randrange(len(held[s]) + 1) if op == "rewrite" else len(held[s])
                held[s] = held[s][:cut] + [rng.randrange(1000, 240000)
                                           for _ in range(rng.randrange(1, 150))]
                _ok(c.post(f"/v1/shadow/sessions/{s}/turn", json={"prompt_ids": held[s]}),
                    errors)
            elif op == "output":
                new = [rng.randrange(1000, 240000) for _ in range(rng.randrange(1, 60))]
                held[s] += new
                _ok(c.post(f"/v1/shadow/sessions/{s}/output", json={"ids": new}), errors)
            elif op in ("round", "end"):
                _ok(c.post(f"/v1/shadow/sessions/{s}/{op}"), errors)
            elif op == "ask":
                _ok(c.post("/v1/shadow/ask", json={"session": s, "question": "Code?",
                                                   "choices": ["yes", "no"]}), errors)
            elif op == "narration":
                _ok(c.get(f"/v1/shadow/sessions/{s}/narration"), errors)
            else:
                _ok(c.get("/metrics" if op == "metrics" else "/v1/shadow/status"), errors)
        for s in names:
            _ok(c.post(f"/v1/shadow/sessions/{s}/end"), errors)
    sent.update(held)


def _ok(response: httpx.Response, errors: list) -> None:
    if response.status_code != 200:
        errors.append((response.request.url.path, response.status_code, response.text[:200]))


def test_routes_and_the_idle_loop_at_once_leave_every_session_exact(tmp_path):
    """Four clients on eight sessions against the idle loop, with room for two sessions: every
    route answers 200, sessions spill and come back, and afterwards each session holds exactly
    the ids its client sent and its committed state equals a fresh prefill."""
    with Server(_cfg(tmp_path, 2.5 * SESSION_MB)) as srv:
        sent, errors = {}, []
        clients = [threading.Thread(target=_client_loop, args=(srv.url, seed, sent, errors))
                   for seed in range(4)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(timeout=300)
        assert not any(t.is_alive() for t in clients), "a client did not finish in 300 s"
        assert errors == []
        shadow = srv.service.shadow
        stats = shadow.stats()
        assert stats["spills"] > 0 and stats["restores"] > 0
        assert stats["totals"]["num_chunks"] > 0
        assert sorted(stats["sessions"]) == sorted(sent)
        for sid, ids in sent.items():
            with shadow.lock:
                assert shadow.reader.ids(sid) == ids, sid
            assert shadow.check_exact(sid)
            assert shadow.reader.committed(sid) % G == 0


def test_existence_checks_restore_nothing(tmp_path):
    """`end`, `narration`, `output` of a parked session and status answer without bringing it
    back from disk: the restores counter stays and the session stays on disk until it is read."""
    with Server(_cfg(tmp_path, 1.2 * SESSION_MB)) as srv, httpx.Client(base_url=srv.url) as c:
        rng = random.Random(3)
        for sid in ("a", "b"):
            ids = [rng.randrange(1000, 240000) for _ in range(3 * G + 5)]
            assert c.post(f"/v1/shadow/sessions/{sid}/turn",
                          json={"prompt_ids": ids}).status_code == 200
            assert c.post("/v1/shadow/ask", json={"session": sid, "question": "Code?",
                                                  "choices": ["yes", "no"]}).status_code == 200
        status = c.get("/v1/shadow/status").json()
        assert status["sessions"]["a"]["residency"] == "disk"
        restores = status["restores"]
        assert c.post("/v1/shadow/sessions/a/end").status_code == 200
        assert c.get("/v1/shadow/sessions/a/narration").json()["narrations"] == []
        assert c.post("/v1/shadow/sessions/zz/end").status_code == 404
        status = c.get("/v1/shadow/status").json()
        assert status["restores"] == restores
        assert status["sessions"]["a"]["residency"] == "disk"
        assert status["sessions"]["a"]["committed"] == 3 * G
        out = c.post("/v1/shadow/sessions/a/output", json={"ids": [5, 6]})   # feeds: restores
        assert out.status_code == 200 and out.json()["num_ids"] == 3 * G + 7
        assert c.get("/v1/shadow/status").json()["restores"] == restores + 1
        assert srv.service.shadow.check_exact("a")


@pytest.mark.parametrize("route", ["end", "narration"])
def test_unknown_sessions_are_404_without_touching_the_disk(tmp_path, route):
    with Server(_cfg(tmp_path, 1.2 * SESSION_MB)) as srv, httpx.Client(base_url=srv.url) as c:
        r = (c.post if route == "end" else c.get)(f"/v1/shadow/sessions/nobody/{route}")
        assert r.status_code == 404 and "unknown session" in r.json()["detail"]
        assert c.get("/v1/shadow/status").json()["restores"] == 0


def test_a_session_another_process_wrote_is_found_without_a_restore(tmp_path, tiny):
    """A file written into the service's disk folder after it started (another process sharing
    the folder): routes find the session by its manifest without restoring it, DELETE deletes
    the manifest (its pages stay, shared by key, until the TTL or the cap), and a later turn
    with the same ids resumes from those pages without reading them."""
    from shadow_plugin import Reader
    with Server(_cfg(tmp_path, 2.5 * SESSION_MB)) as srv, httpx.Client(base_url=srv.url) as c:
        other = Reader(tiny, grid=G, disk_dir=tmp_path / "disk")
        ids = [random.Random(5).randrange(1000, 240000) for _ in range(2 * G + 9)]
        other.feed("x", ids, "prompt")
        other.read("x")
        other.close()                                   # writes x's file
        files = list((tmp_path / "disk" / "sessions").rglob("*.safetensors"))
        assert len(files) == 1
        assert c.post("/v1/shadow/sessions/x/end").status_code == 200
        status = c.get("/v1/shadow/status").json()
        assert status["sessions"]["x"]["residency"] == "disk" and status["restores"] == 0
        assert status["sessions"]["x"]["committed"] == 2 * G
        assert c.delete("/v1/shadow/sessions/x").status_code == 200
        assert not files[0].exists()
        assert c.post("/v1/shadow/sessions/x/end").status_code == 404
        r = c.post("/v1/shadow/sessions/x/turn", json={"prompt_ids": ids})
        assert r.status_code == 200 and r.json()["committed"] == 2 * G
        assert c.get("/v1/shadow/status").json()["prefix_cache_hit_tokens"]["disk"] == 2 * G
