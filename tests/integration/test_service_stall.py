"""Issue 34: one long question, one long summary or one check of a long session does not stall
the host. While it runs on a real server (loopback, uvicorn in a thread, seeded), the service's
lock is never held longer than a few chunks' time, and another session's turn, output and end
and the status complete within a bound in chunks too (looser: on a loaded 2-core machine a
thread waits for a core as well), one chunk's time measured in the same run (the reader's mean
read time a chunk, or the question's, summary's or check's own mean time a step when the
machine's load made that longer): a ratio, no absolute bound. Past the limits on a question's
ids and a summary's tokens: 413 and 400, nothing held."""
import random
import threading
import time

import httpx
import pytest
from helpers import rand_ids  # noqa: E402
from serving import Server  # noqa: E402

from evals.stall import beside_host_calls  # noqa: E402
from shadow_plugin.scheduling.scheduler import SchedulerConfig
from shadow_plugin.server.config import ServiceConfig

G = 64
MAX_HOLD_CHUNKS = 4      # the lock: one piece (a chunk a little deeper than the session's
#                          mean), a burst sized to one chunk, or a host call's own work
MAX_WAIT_CHUNKS = 20     # a host call: one hold, its own work, the HTTP trip, and the cores'
#                          scheduling on a loaded 2-core machine; before issue 34 it waited
#                          for the whole question (over 40 chunks here)


class TimedLock:
    """The service's lock, each outermost hold timed (ms) into `holds` (the facade and the host
    read `host.lock` at each use, so it can stand in for it)."""

    def __init__(self, lock):
        self.lock, self.local, self.holds = lock, threading.local(), []

    def acquire(self, *args, **kwargs):
        got = self.lock.acquire(*args, **kwargs)
        if got:
            depth = getattr(self.local, "depth", 0)
            if depth == 0:
                self.local.t0 = time.perf_counter()
            self.local.depth = depth + 1
        return got

    def release(self):
        self.local.depth -= 1
        if self.local.depth == 0:
            self.holds.append((time.perf_counter() - self.local.t0) * 1e3)
        self.lock.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


def _cfg(tmp_path, **kw) -> ServiceConfig:
    return ServiceConfig(model="random:tiny", device="cpu", grid=G, state_dir=tmp_path,
                         scheduler=SchedulerConfig(grid=G, poll_s=0.02), **kw)


def _words(num_chars: int) -> str:
    rng = random.Random(0)
    return " ".join("".join(rng.choice("abcdefghij") for _ in range(rng.randrange(1, 6)))
                    for _ in range(num_chars // 3))[:num_chars]


def _host_calls_during(c: httpx.Client, path: str,
                       body: dict | None) -> tuple[dict, float, dict]:
    """Run the question or summary (or the check: `body` None) in a thread while another
    session's turn, output, end and the status are called back to back
    (evals.stall.beside_host_calls): (its reply, its wall time in ms, the longest wait of each
    call in ms)."""
    reply, job_ms, waits = beside_host_calls(c, path, body, session="other",
                                             prompt_ids=rand_ids(50))
    return reply, job_ms, {name: max(ms) for name, ms in waits.items()}


def _assert_holds(holds: list[float], chunk_ms: float) -> None:
    """Every hold of the lock within MAX_HOLD_CHUNKS chunks but one (on a shared 2-core machine
    the OS may take the cores from one hold; a hold of the whole job is still caught: it would
    be over 10 * MAX_HOLD_CHUNKS chunks, see `it bites`), and that one within 3x the bound."""
    over = [ms for ms in holds if ms >= MAX_HOLD_CHUNKS * chunk_ms]
    assert len(over) <= 1, (over, chunk_ms)
    assert max(holds) < 3 * MAX_HOLD_CHUNKS * chunk_ms, (max(holds), chunk_ms)


def _chunk_ms(c: httpx.Client) -> float:
    totals = c.get("/v1/shadow/status").json()["totals"]
    return totals["read_ms"] / totals["num_chunks"]


def test_a_long_question_summary_and_check_leave_other_sessions_calls_within_a_few_chunks(
        tmp_path):
    with Server(_cfg(tmp_path)) as srv, httpx.Client(base_url=srv.url, timeout=300) as c:
        timed = srv.service.host.lock = TimedLock(srv.service.host.lock)
        c.post("/v1/shadow/sessions/long/turn", json={"prompt_ids": rand_ids(100 * G + 7)})
        c.post("/v1/shadow/sessions/long/end")
        c.post("/v1/shadow/sessions/other/turn", json={"prompt_ids": rand_ids(50)})
        c.post("/v1/shadow/sessions/other/end")
        assert c.post("/v1/shadow/ask", json={"session": "long", "question": "Code?",
                                              "choices": ["yes", "no"], "wait": True,
                                              "timeout_s": 120}).status_code == 200
        pinned = c.get("/v1/shadow/status").json()["pages"]["pinned"]
        question = _words(9_000)
        timed.holds.clear()
        reply, job_ms, longest = _host_calls_during(c, "/v1/shadow/ask", {
            "session": "long", "question": question, "choices": ["yes", "no"]})
        assert reply.status_code == 200, reply.text
        num_pieces = reply.json()["num_forwarded_tokens"] // G
        assert num_pieces > 40                                      # many pieces
        chunk_ms = max(_chunk_ms(c), job_ms / num_pieces)           # the same run's chunk
        assert job_ms > 10 * MAX_HOLD_CHUNKS * chunk_ms, (job_ms, chunk_ms)  # it bites
        _assert_holds(timed.holds, chunk_ms)
        for name, ms in longest.items():
            assert ms < MAX_WAIT_CHUNKS * chunk_ms, (name, ms, chunk_ms, job_ms)
            assert ms < job_ms / 3, (name, ms, chunk_ms, job_ms)

        timed.holds.clear()
        reply, job_ms, longest = _host_calls_during(c, "/v1/shadow/summarize", {
            "session": "long", "max_tokens": 400})
        assert reply.status_code == 200, reply.text
        num_tokens = len(reply.json()["ids"])
        assert num_tokens > 100, reply.json()                 # the seed decodes long
        chunk_ms = max(_chunk_ms(c), job_ms / num_tokens)     # a chunk, or a burst's token
        _assert_holds(timed.holds, chunk_ms)
        for name, ms in longest.items():
            assert ms < MAX_WAIT_CHUNKS * chunk_ms, (name, ms, chunk_ms, job_ms)
            assert ms < job_ms / 3, (name, ms, chunk_ms, job_ms)
        assert c.get("/v1/shadow/status").json()["pages"]["pinned"] == pinned  # given back

        timed.holds.clear()                   # a check re-reads the session from 0
        reply, job_ms, longest = _host_calls_during(c, "/v1/shadow/sessions/long/check", None)
        assert reply.status_code == 200, reply.text
        report = reply.json()
        assert (report["exact"], report["committed"], report["moved"]) == (True, 100 * G, False)
        chunk_ms = max(_chunk_ms(c), job_ms / 100)
        assert job_ms > 10 * MAX_HOLD_CHUNKS * chunk_ms, (job_ms, chunk_ms)  # it bites
        _assert_holds(timed.holds, chunk_ms)
        for name, ms in longest.items():
            assert ms < MAX_WAIT_CHUNKS * chunk_ms, (name, ms, chunk_ms, job_ms)
            assert ms < job_ms / 3, (name, ms, chunk_ms, job_ms)
        assert c.get("/v1/shadow/status").json()["pages"]["pinned"] == pinned
        assert srv.service.reader.check_exact("long")


@pytest.mark.parametrize("route", ["ask", "summarize", "chat"])
def test_past_the_limits_413_and_400_name_the_setting_and_hold_nothing(tmp_path, route):
    cfg = _cfg(tmp_path, max_question_tokens=100, max_summary_tokens=16)
    with Server(cfg) as srv, httpx.Client(base_url=srv.url, timeout=120) as c:
        c.post("/v1/shadow/sessions/s/turn", json={"prompt_ids": rand_ids(3 * G)})
        long_text = _words(2000)
        if route == "ask":
            r = c.post("/v1/shadow/ask", json={"session": "s", "question": long_text,
                                               "choices": ["a", "b"]})
        elif route == "summarize":
            r = c.post("/v1/shadow/summarize", json={"session": "s", "instruction": long_text,
                                                     "max_tokens": 8})
        else:
            r = c.post("/v1/shadow/chat/completions", json={
                "session": "s", "choices": ["a", "b"],
                "messages": [{"role": "user", "content": long_text}]})
        assert r.status_code == 413, r.text
        assert "SHADOW_MAX_QUESTION_TOKENS" in r.json()["detail"] and r.json()["limit"] == 100
        assert r.json()["num_ids"] > 100
        r = c.post("/v1/shadow/summarize", json={"session": "s", "max_tokens": 17})
        assert r.status_code == 400
        assert "SHADOW_MAX_SUMMARY_TOKENS" in r.json()["detail"] and "17" in r.json()["detail"]
        status = c.get("/v1/shadow/status").json()   # only the session's own pages held
        assert status["pages"]["pinned"] == status["sessions"]["s"]["committed"] // G
        ok = c.post("/v1/shadow/summarize", json={"session": "s", "max_tokens": 16})
        assert ok.status_code == 200 and 1 <= len(ok.json()["ids"]) <= 16
        assert srv.service.reader.check_exact("s")
