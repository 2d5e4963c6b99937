"""The Grafana dashboard shipped in docs/grafana/: every `shadow_*` metric its queries use is
exported on the standalone service's /metrics (its `vllm:*` queries are checked against vLLM's
server in test_vllm.py), and its panels are well formed."""
import json
import time

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from helpers import DASHBOARD, dashboard_metrics  # noqa: E402

from shadow_plugin.scheduling.scheduler import SchedulerConfig  # noqa: E402
from shadow_plugin.server.app import create_app  # noqa: E402
from shadow_plugin.server.config import ServiceConfig  # noqa: E402

G = 64


def test_every_shadow_metric_the_dashboard_queries_is_exported(tmp_path):
    names = dashboard_metrics("shadow_")
    assert len(names) >= 20
    cfg = ServiceConfig(model="random:tiny", device="cpu", grid=G, disk_dir=tmp_path,
                        scheduler=SchedulerConfig(grid=G, poll_s=0.02))
    with TestClient(create_app(cfg), base_url="http://127.0.0.1") as c:
        deadline = time.monotonic() + 60
        while c.get("/healthz").json()["state"] == "loading" and time.monotonic() < deadline:
            time.sleep(0.05)
        c.post("/v1/shadow/sessions/s/turn", json={"prompt_ids": list(range(1000, 1200))})
        metrics = c.get("/metrics").text
    exported = {line.split("{")[0].split()[0] for line in metrics.splitlines()
                if line and not line.startswith("#")}
    assert names <= exported, sorted(names - exported)


def test_the_dashboard_is_importable():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["__inputs"][0]["name"] == "DS_PROMETHEUS" and dash["uid"] == "shadow-reader"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p["gridPos"][
            "w"] <= 24
        for t in p.get("targets", []):
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
