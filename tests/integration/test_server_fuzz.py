"""Schemathesis against the OpenAPI document of the running app (random:tiny): no 5xx."""
import time

import pytest

schemathesis = pytest.importorskip("schemathesis")
from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from shadow_plugin.scheduling.scheduler import SchedulerConfig  # noqa: E402
from shadow_plugin.server.app import create_app  # noqa: E402
from shadow_plugin.server.config import ServiceConfig  # noqa: E402

# bind_host 0.0.0.0: schemathesis sends Host "testserver", which a loopback bind refuses (403);
# the inputs, not the Host rule, are what this fuzzes (test_server covers the rule).
APP = create_app(ServiceConfig(model="random:tiny", device="cpu", grid=64, max_ids=4096,
                               scheduler=SchedulerConfig(grid=64, poll_s=0.05),
                               bind_host="0.0.0.0"))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@pytest.fixture(scope="module", autouse=True)
def running():
    """The app's lifespan around the module: the model loaded, one session fed."""
    with TestClient(APP) as client:
        while client.get("/healthz").json()["state"] == "loading":
            time.sleep(0.05)
        client.post("/v1/shadow/sessions/fuzz/turn", json={"prompt_ids": list(range(1000, 1300))})
        yield


@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    response = case.call()
    assert response.status_code < 500, (case.path, case.body, response.text[:300])
