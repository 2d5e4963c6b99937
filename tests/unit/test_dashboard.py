"""The dashboard's routes in-process (issue 18): the page needs no key and loads nothing from
elsewhere, the history route keeps the auth rules, samples what /metrics exports under the same
names, answers `since`, and its ring stays bounded; bad history settings are refused."""
import base64
import hashlib
import re
import time

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from shadow_plugin.scheduling.scheduler import SchedulerConfig  # noqa: E402
from shadow_plugin.server.app import create_app  # noqa: E402
from shadow_plugin.server.config import ServiceConfig  # noqa: E402
from shadow_plugin.server.history import (  # noqa: E402
    MAX_BACKLOG_SERIES,  # noqa: E402
    History,
    Sampler,
    flatten,
    sample_key,
)

G = 64
KEY = {"Authorization": "Bearer k3y"}
LOCAL = "http://127.0.0.1"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    cfg = ServiceConfig(model="random:tiny", device="cpu", grid=G, api_key="k3y",
                        state_dir=tmp_path_factory.mktemp("dash"), history_every_s=0.1,
                        history_samples=12, scheduler=SchedulerConfig(grid=G, poll_s=0.02))
    with TestClient(create_app(cfg), base_url=LOCAL) as c:
        deadline = time.monotonic() + 60
        while c.get("/healthz").json()["state"] == "loading" and time.monotonic() < deadline:
            time.sleep(0.05)
        yield c


def test_the_page_needs_no_key_and_loads_nothing_from_elsewhere(client):
    for path in ("/v1/shadow/dashboard", "/shadow/dashboard"):
        r = client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        csp = r.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "connect-src 'self'" in csp
        page = r.text
        assert "/*SCRIPT*/" not in page and "window.shadowDashboard" in page
        # only the page's own script runs: the CSP names its hash
        (script,) = re.findall(r"<script>(.*?)</script>", page, re.S)
        digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
        assert f"script-src 'sha256-{digest}'" in csp and "unsafe-inline'; style" not in \
            csp.split("script-src")[1][:90]
        assert client.head(path).status_code == 200
        # no script, style or image from a URL: everything is inline (users may be offline)
        assert not re.search(r"<(script|link|img)[^>]*(src|href)=", page)
        assert "/v1/shadow/history" in page and "/v1/shadow/status" in page
        slash = client.get(path + "/", follow_redirects=False)     # typed with a slash
        assert slash.status_code in (307, 308) and slash.headers["location"].endswith(path)
        assert client.get(path + "/").text == page
    assert client.get("/v1/shadow/history/").status_code == 401     # only the page is open
    assert client.get("/v1/shadow/history").status_code == 401      # the data needs the key
    assert client.get("/v1/shadow/status").status_code == 401


def test_history_samples_the_metrics_names_and_answers_since(client):
    rng_ids = list(range(1000, 1000 + 3 * G + 5))
    assert client.post("/v1/shadow/sessions/h1/turn", json={"prompt_ids": rng_ids},
                       headers=KEY).status_code == 200
    time.sleep(0.5)
    h = client.get("/v1/shadow/history", headers=KEY).json()
    assert h["every_s"] == 0.1 and h["max_samples"] == 12 and h["started"] <= h["now"]
    samples = h["samples"]
    assert 2 <= len(samples) <= 12
    assert all(a["t"] < b["t"] and a["seq"] + 1 == b["seq"] for a, b in zip(samples, samples[1:]))
    newest = samples[-1]["values"]
    metrics = {sample_key(s.name, s.labels) for fam in text_string_to_metric_families(
        client.get("/metrics", headers=KEY).text) for s in fam.samples}
    assert set(newest) <= metrics                          # the same names as /metrics
    assert 'shadow_session_warm_tokens{session="h1"}' in metrics      # for routers: not
    assert not any(k.startswith(("shadow_session_", "shadow_server")) for k in newest)
    for name in ("shadow_prefix_cache_queried_tokens_total", "shadow_read_tokens_total",
                 'shadow_prefix_cache_hit_tokens_total{tier="memory"}',
                 'shadow_reread_tokens_total{cause="bpe"}', 'shadow_pages{state="pinned"}',
                 'shadow_gdn_entries{state="resident"}', 'shadow_turn_starts_total{fresh="true"}',
                 'shadow_backlog_ids{session="h1"}', "shadow_resident_cap_bytes"):
        assert name in newest, name
    assert newest["shadow_prefix_cache_queried_tokens_total"] >= len(rng_ids)
    assert not any(k.endswith("_bucket") for k in newest)
    cut = samples[-3]["t"]
    later = client.get("/v1/shadow/history", params={"since": cut}, headers=KEY).json()
    assert later["samples"] and all(s["t"] > cut for s in later["samples"])
    assert later["samples"][0] in samples
    seq = samples[-2]["seq"]
    after = client.get("/v1/shadow/history", params={"after": seq}, headers=KEY).json()
    assert after["samples"] and all(s["seq"] > seq for s in after["samples"])
    recent = client.get("/v1/shadow/history", params={"window_s": 0.25}, headers=KEY).json()
    assert 1 <= len(recent["samples"]) <= 4
    assert all(s["t"] > recent["now"] - 0.25 for s in recent["samples"])
    for bad in ("since=x", "since=-1", "after=-1", "window_s=0"):
        assert client.get(f"/v1/shadow/history?{bad}", headers=KEY).status_code == 422
    time.sleep(1.6)                                        # 16 samples' time: the ring holds 12
    assert len(client.get("/v1/shadow/history", headers=KEY).json()["samples"]) == 12


class _Source:
    """A collector over a dict (or raising), like server.metrics.Collector."""

    def __init__(self, backlog: dict | None = None, fail: bool = False):
        self.backlog, self.fail = backlog or {}, fail

    def collect(self):
        if self.fail:
            raise RuntimeError("boom")
        yield CounterMetricFamily("shadow_read_tokens", "ids", 7)
        g = GaugeMetricFamily("shadow_backlog_ids", "ids", labels=["session"])
        for sid, n in self.backlog.items():
            g.add_metric([sid], n)
        yield g


def test_a_sample_keeps_the_largest_backlogs_only():
    backlog = {f"s{i}": i for i in range(100)}
    values = flatten(_Source(backlog))
    kept = {k for k in values if k.startswith("shadow_backlog_ids")}
    assert len(kept) == MAX_BACKLOG_SERIES and values["shadow_read_tokens_total"] == 7
    assert kept == {f'shadow_backlog_ids{{session="s{i}"}}' for i in range(68, 100)}


def test_a_failing_sample_is_skipped_and_sampling_goes_on():
    h = History(every_s=1.0, max_samples=3)
    source = _Source(fail=True)
    sampler = Sampler(h, source)
    sampler.sample()
    assert h.since() == []
    source.fail = False
    for _ in range(5):
        sampler.sample()
    assert len(h.since()) == 3 and h.since()[-1]["values"]["shadow_read_tokens_total"] == 7


@pytest.mark.parametrize("kw, name", [({"history_every_s": 0}, "SHADOW_HISTORY_S"),
                                      ({"history_every_s": float("inf")}, "SHADOW_HISTORY_S"),
                                      ({"history_every_s": 0.001}, "SHADOW_HISTORY_S"),
                                      ({"history_samples": 0}, "SHADOW_HISTORY_SAMPLES"),
                                      ({"history_samples": 10**7}, "SHADOW_HISTORY_SAMPLES")])
def test_bad_history_settings_are_refused_by_name(kw, name):
    with pytest.raises(ValueError, match=name):
        create_app(ServiceConfig(model="random:tiny", **kw))


def test_history_settings_from_the_environment():
    cfg = ServiceConfig.from_env({"SHADOW_HISTORY_S": "0.5", "SHADOW_HISTORY_SAMPLES": "10"})
    assert (cfg.history_every_s, cfg.history_samples) == (0.5, 10)
    with pytest.raises(ValueError, match="SHADOW_HISTORY_S"):
        ServiceConfig.from_env({"SHADOW_HISTORY_S": "often"})
