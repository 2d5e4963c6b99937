"""The service killed with SIGKILL (issue 19): a seeded multi-session workload with spills (a
small resident cap, a disk folder), killed at 20 seeded points, half right after an
acknowledged call and half while a call is in flight, restarted each time. After each restart
every session holds exactly what the host sent, or (marked stale) a prefix of it, or, for the
call in flight, what it sent before or after that call; every session is exact; the host
re-synchronises stale sessions by sending their turn again. Outputs at the wrong position get
409; a manifest damaged while the service was down is listed in status with its reason until
the session is deleted."""
import random
import signal
import threading
import time

import numpy as np
import pytest
import xxhash

httpx = pytest.importorskip("httpx")
from serving import free_port, start  # noqa: E402

G = 64
NUM_KILLS = 20
SESSIONS = ("a", "b", "c")


def _digest(ids) -> str:
    return xxhash.xxh3_64(np.asarray(ids, dtype="<i8").tobytes()).hexdigest()


class Service:
    """The service in a subprocess on one folder, started again after each kill."""

    def __init__(self, tmp):
        self.tmp, self.port = tmp, free_port()
        self.url, self.proc = f"http://127.0.0.1:{self.port}", None

    def start(self) -> None:
        self.proc, _ = start({"SHADOW_GRID": str(G), "SHADOW_DISK": str(self.tmp / "disk"),
                              "SHADOW_GB": "0.002", "SHADOW_DIR": str(self.tmp),
                              "OMP_NUM_THREADS": "1"}, self.port)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def post(self, path: str, body: dict | None = None):
        return httpx.post(f"{self.url}{path}", json=body, timeout=60)


def _steps(rng: random.Random, n: int):
    """The workload: (session, kind, ids, cut) with kind turn, output, ask or end; a turn's ids
    are the ids it adds after dropping `cut` ids of the session's end (a boundary rewrite)."""
    open_turn = {s: False for s in SESSIONS}
    for _ in range(n):
        s = rng.choice(SESSIONS)
        if not open_turn[s] or rng.random() < 0.15:
            open_turn[s] = True
            yield s, "turn", [rng.randrange(1000, 240000) for _ in range(rng.randrange(20, 200))
                              ], rng.randrange(0, 3)
        elif rng.random() < 0.2:                  # reads what it holds: pages pinned, spills
            yield s, "ask", [], 0
        elif rng.random() < 0.6:
            yield s, "output", [rng.randrange(1000, 240000) for _ in range(rng.randrange(1, 40))
                                ], 0
        else:
            open_turn[s] = False
            yield s, "end", [], 0


def _apply(svc: Service, sent: dict, step) -> tuple[dict, int]:
    """Send one step; returns the host's ids after it and the HTTP status."""
    s, kind, ids, cut = step
    after = dict(sent)
    if kind == "turn":
        held = sent.get(s, [])
        after[s] = held[:max(len(held) - cut, 0)] + ids
        r = svc.post(f"/v1/shadow/sessions/{s}/turn", {"prompt_ids": after[s]})
    elif kind == "output":
        after[s] = sent[s] + ids
        r = svc.post(f"/v1/shadow/sessions/{s}/output", {"ids": ids,
                                                         "position": len(sent[s])})
    elif kind == "ask":
        r = svc.post("/v1/shadow/ask", {"session": s, "question": "Code?",
                                         "choices": ["yes", "no"]})
        assert r.status_code != 200 or r.json()["at"] == len(sent[s])
    else:
        r = svc.post(f"/v1/shadow/sessions/{s}/end")
    return after, r.status_code


def _check(svc: Service, before: dict, after: dict) -> list[str]:
    """Every session against what the host sent (before or after the call in flight);
    returns the sessions to re-synchronise (stale, or touched by the call in flight)."""
    status = httpx.get(f"{svc.url}/v1/shadow/status", timeout=60).json()["sessions"]
    resync = []
    for s in set(before) | set(after):
        cands = [c for c in (before.get(s), after.get(s)) if c is not None]
        if s not in status:
            assert s not in before, f"session {s} was lost"
            resync.append(s)
            continue
        got = httpx.get(f"{svc.url}/v1/shadow/sessions/{s}/check", timeout=120).json()
        assert got["exact"], got
        n = got["num_ids"]
        if status[s]["stale"]:
            assert any(len(c) >= n and _digest(c[:n]) == got["ids_xxh3"] for c in cands), s
            resync.append(s)
        else:
            assert any(_digest(c) == got["ids_xxh3"] for c in cands), (s, n)
            if before.get(s) != after.get(s):
                resync.append(s)
    return resync


def test_sigkill_at_seeded_points_keeps_every_session_true_to_the_host(tmp_path):
    rng = random.Random(19)
    steps = list(_steps(rng, 120))
    kills = sorted(rng.sample(range(5, len(steps)), NUM_KILLS))
    svc = Service(tmp_path)
    svc.start()
    sent: dict[str, list[int]] = {}
    spills = 0
    try:
        for i, step in enumerate(steps):
            if i not in kills:
                sent, code = _apply(svc, sent, step)
                assert code == 200, (i, step[:2], code)
                continue
            before, result = dict(sent), {}
            if kills.index(i) % 2 == 0:               # killed right after the answer
                sent, code = _apply(svc, sent, step)
                assert code == 200
                before = after = sent
                svc.kill()
            else:                                     # killed while the call is in flight
                t = threading.Thread(target=lambda: result.update(
                    zip(("after", "code"), _safe_apply(svc, before, step))))
                t.start()
                time.sleep(rng.uniform(0.0, 0.03))
                svc.kill()
                t.join(60)
                after = result.get("after") or _apply_offline(before, step)
            svc.start()
            for s in _check(svc, before, after):      # the host sends the turn again
                assert svc.post(f"/v1/shadow/sessions/{s}/turn",
                                {"prompt_ids": after[s]}).status_code == 200
            sent = after
            spills = max(spills, httpx.get(f"{svc.url}/v1/shadow/status").json()["spills"])
        assert _check(svc, sent, sent) == []
        s = SESSIONS[0]
        r = svc.post(f"/v1/shadow/sessions/{s}/output", {"ids": [5], "position": 3})
        assert r.status_code == 409 and r.json()["held"] == len(sent[s]) and \
            str(len(sent[s])) in r.json()["detail"]
        assert spills > 0 or httpx.get(f"{svc.url}/v1/shadow/status").json()["spills"] > 0
        _damaged_while_down(svc, tmp_path, sent)
    finally:
        if svc.proc.poll() is None:
            svc.kill()


def _safe_apply(svc: Service, sent: dict, step):
    try:
        return _apply(svc, sent, step)
    except httpx.HTTPError:
        return None, None


def _apply_offline(sent: dict, step) -> dict:
    """What the host sent with the step, whatever the service made of it."""
    s, kind, ids, cut = step
    after = dict(sent)
    if kind == "turn":
        held = sent.get(s, [])
        after[s] = held[:max(len(held) - cut, 0)] + ids
    elif kind == "output":
        after[s] = sent[s] + ids
    return after


def _damaged_while_down(svc: Service, tmp_path, sent: dict) -> None:
    svc.kill()
    (folder,) = (tmp_path / "disk" / "sessions").iterdir()
    name = xxhash.xxh3_128(b"b").hexdigest() + ".safetensors"
    raw = bytearray((folder / name).read_bytes())
    raw[-2] ^= 0xFF
    (folder / name).write_bytes(bytes(raw))
    svc.start()
    st = httpx.get(f"{svc.url}/v1/shadow/status").json()
    (listed,) = st["refused_sessions"]
    assert listed["session"] == "b" and listed["reason"] and "b" not in st["sessions"]
    r = svc.post("/v1/shadow/ask", {"session": "b", "question": "q", "choices": ["x", "y"]})
    assert r.status_code == 404 and "refused at start-up" in r.json()["detail"]
    assert httpx.delete(f"{svc.url}/v1/shadow/sessions/b").status_code == 200
    assert httpx.get(f"{svc.url}/v1/shadow/status").json()["refused_sessions"] == []
