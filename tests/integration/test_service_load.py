"""The service under load (issue 19), a subprocess on a loopback port: 200 asks waiting hold
nothing (health and another session's ask answer before any wait ends); a client that leaves
stops the reading done for it; rounds of concurrent asks run in the bounded pool (429 with
Retry-After past it) and leave the memory flat; a catch-up past its bound is refused before any
reading; a prompt past the model's positions is refused, naming the policy. Loops are bounded
in count and time; no latency bound is asserted, only orders."""
import asyncio
import time

import pytest

httpx = pytest.importorskip("httpx")
from helpers import rand_ids  # noqa: E402
from serving import free_port, start, stop  # noqa: E402

G = 64
BOUND = 50_000
ASK = {"question": "Code?", "choices": ["yes", "no"]}


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("load")
    proc, url = start({"SHADOW_GRID": str(G), "SHADOW_DIR": str(tmp), "SHADOW_ASK_WORKERS": "2",
                       "SHADOW_ASK_QUEUE": "16", "SHADOW_ASK_MAX_CATCHUP_TOKENS": str(BOUND),
                       "SHADOW_THREADS": "1"}, free_port())
    try:
        # "open" keeps a turn open: the idle window reads nothing, so waits wait
        assert httpx.post(f"{url}/v1/shadow/sessions/open/turn",
                          json={"prompt_ids": rand_ids(3 * G, 0)}).status_code == 200
        assert httpx.post(f"{url}/v1/shadow/sessions/s/turn",
                          json={"prompt_ids": rand_ids(2 * G + 5, 1)}).status_code == 200
        yield url, proc
    finally:
        stop(proc)


def _read_tokens(url) -> float:
    text = httpx.get(f"{url}/metrics").text
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith("shadow_read_tokens_total")))


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_waiting_asks_hold_nothing_others_need(svc):
    url, _ = svc

    async def run():
        async with httpx.AsyncClient(base_url=url, timeout=60,
                                     limits=httpx.Limits(max_connections=300)) as c:
            t0 = time.monotonic()
            waits = [asyncio.create_task(c.post("/v1/shadow/ask", json={
                "session": "open", **ASK, "wait": True, "timeout_s": 8})) for _ in range(200)]
            await asyncio.sleep(1.0)
            health = await c.get("/healthz")
            t_health = time.monotonic() - t0
            other = await c.post("/v1/shadow/ask", json={"session": "s", **ASK})
            t_other = time.monotonic() - t0
            done = await asyncio.gather(*waits)
            t_end = time.monotonic() - t0
            return health, t_health, other, t_other, done, t_end

    health, t_health, other, t_other, done, t_end = asyncio.run(run())
    assert health.status_code == 200 and other.status_code == 200, other.text
    assert {r.status_code for r in done} == {504}            # each wait ended at its timeout
    assert "open turns" in done[0].json()["detail"] and done[0].json()["backlog"] > 0
    assert t_health < 8 and t_other < 8 <= t_end + 0.5      # both before any wait ended


def test_a_client_that_leaves_stops_the_reading_done_for_it(svc):
    url, _ = svc
    assert httpx.post(f"{url}/v1/shadow/sessions/big/turn",
                      json={"prompt_ids": rand_ids(40_000, 2)}).status_code == 200
    before = _read_tokens(url)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/shadow/ask", json={"session": "big", **ASK}, timeout=1.0)
    time.sleep(1.5)                                          # the next chunk's check, at most
    stopped = _read_tokens(url)
    time.sleep(2.0)
    assert _read_tokens(url) == stopped                      # no reading for it afterwards
    assert before < stopped < before + 40_000 - G            # it had read, and stopped


def test_rounds_of_concurrent_asks_stay_in_the_pool_and_in_memory(svc):
    url, proc = svc

    async def round_():
        async with httpx.AsyncClient(base_url=url, timeout=120,
                                     limits=httpx.Limits(max_connections=100)) as c:
            return await asyncio.gather(*[c.post("/v1/shadow/ask", json={"session": "s", **ASK})
                                          for _ in range(40)])

    rss, codes = [], []
    for _ in range(5):
        answers = asyncio.run(round_())
        codes.append(sorted(r.status_code for r in answers))
        rss.append(_rss_kib(proc.pid))
    for got in codes:                                       # 2 workers + 16 queued at most
        assert set(got) <= {200, 429} and got.count(200) >= 18
    refused = [r for r in asyncio.run(round_()) if r.status_code == 429]
    assert refused and refused[0].headers["retry-after"] and "SHADOW_ASK_WORKERS" in \
        refused[0].json()["detail"]
    assert rss[-1] <= rss[0] + 64 * 1024, rss                # flat after the first round


def test_a_catch_up_past_its_bound_is_refused_before_reading(svc):
    url, _ = svc
    assert httpx.post(f"{url}/v1/shadow/sessions/huge/turn",
                      json={"prompt_ids": rand_ids(BOUND + 3 * G, 3)}).status_code == 200
    before = _read_tokens(url)
    r = httpx.post(f"{url}/v1/shadow/ask", json={"session": "huge", **ASK}, timeout=60)
    assert r.status_code == 409 and r.json()["backlog"] == BOUND + 3 * G
    assert "SHADOW_ASK_MAX_CATCHUP_TOKENS" in r.json()["detail"]
    assert _read_tokens(url) == before
    r = httpx.post(f"{url}/v1/shadow/ask", json={"session": "huge", **ASK, "at": 2 * G})
    assert r.status_code == 200 and r.json()["at"] == 2 * G   # an earlier `at` fits


def test_a_prompt_past_the_models_positions_is_refused(svc):
    url, _ = svc
    r = httpx.post(f"{url}/v1/shadow/sessions/long/turn", timeout=60,
                   json={"prompt_ids": [1000] * (262_144 + 1)})
    assert r.status_code == 400 and "SHADOW_MAX_POSITIONS_POLICY=refuse" in r.json()["detail"]
    assert httpx.get(f"{url}/v1/shadow/sessions/long/narration").status_code == 404
