"""The endpoint plugin (entry point `shadow` in `vllm.endpoint_plugins`; vLLM loads it when
`VLLM_PLUGINS` names it): the shadow's question routes on vLLM's own OpenAI-compatible server,
the same routes and rules as the standalone service (shadow_plugin.server.routes: ask,
summarize, POST /v1/shadow/chat/completions, status, sessions, narration, check, and the
dashboard: GET /v1/shadow/dashboard, also at /shadow/dashboard, outside the /v1 prefix that
vLLM's `--api-key` guards, and GET /v1/shadow/history), reaching the
shadow in vLLM's worker through `engine_client.collective_rpc("shadow_call", ...)`, the worker
method the general plugin installs. The shadow's counters join vLLM's `/metrics`, refreshed
from the worker every METRICS_EVERY_S (not with several API servers, whose metrics vLLM
gathers from PROMETHEUS_MULTIPROC_DIR); each refresh is also the dashboard's history sample.

A route's call runs on vLLM's engine thread between the host's steps; a waiting ask waits here,
one look a call, never in the engine. A question's reply is pushed to this process when it is
ready (server.result_box), rather than waiting for a look through the engine's loop.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from prometheus_client import REGISTRY

from shadow_plugin.server.ask_pool import AskPool
from shadow_plugin.server.config import ServiceConfig
from shadow_plugin.server.dashboard import dashboard_router
from shadow_plugin.server.history import History, flatten
from shadow_plugin.server.metrics import Collector
from shadow_plugin.server.ranks import RankedService, merge_metrics
from shadow_plugin.server.remote import call_pushed
from shadow_plugin.server.result_box import ResultBox
from shadow_plugin.server.routes import question_router

log = logging.getLogger(__name__)
METRICS_EVERY_S = 1.0      # also the dashboard's sampling interval
HISTORY_SAMPLES = 3600
METRICS_IDLE_S = 30.0       # the next look when the shadow does not run
STOP_TIMEOUT_S = 120.0      # how long a planned stop waits for the shadow to write its sessions
NOT_UP = ("error", "NotReady", ("vLLM's engine is not up", False))
NOT_RUNNING = ("the shadow does not run in vLLM's worker: start vLLM with --kv-transfer-config "
               "'{\"kv_connector\": \"ShadowConnector\", \"kv_role\": \"kv_producer\"}' and "
               "VLLM_PLUGINS=shadow")


def engine_identities(engine_client) -> list:
    """The ZMQ identities of the engines the client talks to, in data-parallel rank order,
    when it can call one of them alone (vLLM 0.26 through 0.33: `engine_core.core_engines` and
    `engine_core._call_utility_async(..., engine=)`, probed); [] with one engine, or when this
    vLLM cannot (then `collective_rpc` reaches the first engine's shadow only)."""
    core = getattr(engine_client, "engine_core", None)
    engines = getattr(core, "core_engines", None)
    if not callable(getattr(core, "_call_utility_async", None)) or \
            not isinstance(engines, list) or len(engines) < 2:
        return []
    return list(engines)


def data_parallel_size(engine_client) -> int:
    """The server's --data-parallel-size, as the API server's config says (1 when unknown)."""
    parallel = getattr(getattr(engine_client, "vllm_config", None), "parallel_config", None)
    size = getattr(parallel, "data_parallel_size", 1)
    return size if isinstance(size, int) and size > 0 else 1


class ShadowEndpoint:
    """vLLM's EndpointPlugin protocol: name, required_tasks, attach_router, init_state. With
    data parallelism (several engines behind this API server) each engine's shadow is reached
    on its own (`call_async(..., rank=)`), and the routes' door merges them
    (server.ranks.RankedService)."""

    name = "shadow"
    required_tasks = ("generate",)

    def __init__(self):
        self.engine_client = None
        self.metrics: dict | None = None          # the last metrics fetched from the worker
        self.settings: ServiceConfig | None = None    # the environment's, at attach_router;
        # kv_connector_extra_config over them at init_state (_apply_settings)
        self.collector: Collector | None = None  # /metrics, made once at init_state
        self.history = History(METRICS_EVERY_S, HISTORY_SAMPLES)
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None    # the server's, at init_state
        self._loop_thread: int | None = None
        self._stopped = False                    # the shadow was told to stop (once)
        self._stopping: asyncio.Task | None = None   # that stop, which later callers await
        self.engines: list = []                  # the DP engines' identities (engine_identities)
        self.box = ResultBox()                   # questions' replies, pushed by the workers
        self.pool: AskPool | None = None         # the question routes' pool (attach_router)

    @property
    def num_ranks(self) -> int:
        """The engines whose shadows the routes reach one by one (1 without data
        parallelism)."""
        return max(1, len(self.engines))

    # -- the door's call, from a route's worker thread ------------------------------------------
    async def call_async(self, name: str, kwargs: dict, rank: int | None = None):
        """serve_call's reply from the shadow of data-parallel rank `rank` (None: the only
        engine, or the first) : the first reply of its engine's workers that is not None (its
        rank 0's)."""
        if self.engine_client is None:
            return ("error", "NotReady", ("vLLM's engine is not up", False))
        try:
            if self.engines and rank is not None:
                replies = await self.engine_client.engine_core._call_utility_async(
                    "collective_rpc", "shadow_call", None, (name, kwargs), None,
                    engine=self.engines[rank])
            else:
                replies = await self.engine_client.collective_rpc("shadow_call",
                                                                  args=(name, kwargs))
        except Exception as e:                # the engine dead or stopping: 503, not 500
            return ("error", "NotReady", (f"vLLM's engine did not answer: {e}", False))
        reply = next((r for r in replies or () if r is not None), None)
        return reply if reply is not None else ("error", "NotReady", (NOT_RUNNING, True))

    async def call_all_async(self, name: str, kwargs: dict) -> list:
        """One reply per rank, in rank order (the calls made at once)."""
        if not self.engines:
            return [await self.call_async(name, kwargs)]
        return list(await asyncio.gather(*(self.call_async(name, kwargs, rank)
                                           for rank in range(len(self.engines)))))

    def _in_loop(self, coro, not_up):
        """Run `coro` in vLLM's event loop from a worker thread (a route's, or the question
        pool's: any thread but the event loop's) and return its result."""
        if self._loop is None:
            coro.close()
            return not_up
        if threading.get_ident() == self._loop_thread:
            coro.close()
            raise RuntimeError("ShadowEndpoint.call on the event loop's own thread would wait "
                               "for itself: call it from a worker thread (or call_async)")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def call(self, name: str, kwargs: dict, rank: int | None = None):
        """call_async from a worker thread."""
        return self._in_loop(self.call_async(name, kwargs, rank), NOT_UP)

    def call_rank(self, rank: int, name: str, kwargs: dict):
        """call on data-parallel rank `rank` (server.ranks.RankCall); a question's reply as
        the worker pushes it (remote.call_pushed)."""
        rank_or_none = rank if self.engines else None
        return call_pushed(lambda n, kw: self.call(n, kw, rank_or_none), self.box, name, kwargs)

    def call_all(self, name: str, kwargs: dict) -> list:
        """call_all_async from a worker thread (server.ranks.AllCall)."""
        return self._in_loop(self.call_all_async(name, kwargs), [NOT_UP])

    # -- vLLM's hooks ---------------------------------------------------------------------------
    def attach_router(self, app) -> None:
        cfg = self.settings = ServiceConfig.from_env()
        door = RankedService(self.call_rank, self.call_all, lambda: self.num_ranks)
        self.pool = AskPool(cfg.ask_workers, cfg.ask_queue)      # sized again at init_state
        app.include_router(question_router(door, self.pool))
        app.include_router(dashboard_router(self.history))
        self._stop_at_lifespan_end(app)

    def _stop_at_lifespan_end(self, app) -> None:
        """The planned stop's first hook: uvicorn runs the app's lifespan exit when it shuts
        down, with the event loop running and vLLM's engine still up (vLLM 0.26 stops its
        engine only after uvicorn has finished, 0.32 before it: `_stop_first` covers that),
        so the shadow is told to stop and write its sessions there, before vLLM's own
        lifespan exit."""
        original = app.router.lifespan_context

        @contextlib.asynccontextmanager
        async def lifespan(app_):
            async with original(app_) as state:
                try:
                    yield state
                finally:
                    await self.stop_shadow()
        app.router.lifespan_context = lifespan

    async def stop_shadow(self) -> None:
        """Tell the shadow to stop and write its sessions, once: a second caller waits for
        the first's stop (a failure is logged and the stop goes on without the files)."""
        if self.engine_client is None:
            return
        if self._stopping is None:
            self._stopped = True
            if self._task is not None:
                self._task.cancel()
            self._stopping = asyncio.ensure_future(self._stop_call())
        await asyncio.shield(self._stopping)

    async def _stop_call(self) -> None:
        """"stop" to every rank's shadow, at once."""
        try:
            replies = await asyncio.wait_for(self.call_all_async("stop", {}), STOP_TIMEOUT_S)
            for rank, reply in enumerate(replies):
                if reply[0] != "ok":
                    log.warning("shadow: sessions not written at the stop (rank %d): %s",
                                rank, reply)
        except Exception as e:                   # the stop goes on without the shadow's files
            log.warning("shadow: sessions not written at the stop: %r", e)

    async def init_state(self, engine_client, state, args) -> None:
        self.engine_client = engine_client
        self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()
        if engine_client is None:            # vLLM's render-only server: no engine, no shadow
            return
        self._apply_settings(engine_client)
        self.collector = Collector(lambda: self.metrics, self.settings.metrics_sessions)
        self.engines = engine_identities(engine_client)
        num_dp = data_parallel_size(engine_client)
        if num_dp > 1 and not self.engines:
            log.warning("shadow: data parallelism (%d ranks), but this vLLM's engine client "
                        "offers no call to one engine (engine_core._call_utility_async): the "
                        "shadow's routes reach the first engine's shadow only", num_dp)
        elif self.engines:
            log.info("shadow: the routes reach %d data-parallel ranks' shadows",
                     len(self.engines))
        try:
            REGISTRY.register(self.collector)
        except ValueError:                   # registered by an earlier init in this process
            pass
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._refresh_metrics())
        self._stop_first(engine_client, loop)

    def _apply_settings(self, engine_client) -> None:
        """The API server's own settings from kv_connector_extra_config over the environment,
        as the worker reads its: the question pool's size (SHADOW_ASK_WORKERS,
        SHADOW_ASK_QUEUE) and the sessions with /metrics series of their own
        (SHADOW_METRICS_SESSIONS). attach_router runs before vLLM's config is at hand, so it
        read the environment alone. A setting that does not parse is the worker's to refuse
        (its load fails naming it): logged here, and the environment's kept. (The dashboard's
        history on vLLM samples every METRICS_EVERY_S and keeps HISTORY_SAMPLES.)"""
        kv = getattr(getattr(engine_client, "vllm_config", None), "kv_transfer_config", None)
        extra = getattr(kv, "kv_connector_extra_config", None)
        try:
            cfg = ServiceConfig.from_env_with(extra)
            if self.pool is not None and extra:
                self.pool.resize(cfg.ask_workers, cfg.ask_queue)
            self.settings = cfg
        except (ValueError, RuntimeError) as e:
            self.settings = self.settings or ServiceConfig.from_env()
            log.warning("shadow: the API server keeps its settings from the environment "
                        "(question pool %s, %d sessions with /metrics series): %s",
                        self.pool and (self.pool.workers, self.pool.queue),
                        self.settings.metrics_sessions, e)

    def _stop_first(self, engine_client, loop) -> None:
        """On a planned stop (SIGTERM) vLLM's front end stops the engine at once (killing its
        processes after `--shutdown-timeout`, 0 by default), so the connector's `shutdown` may
        never run: the shadow is told to stop and write its sessions first, through the same
        RPC, when the front end calls the engine client's `shutdown` (from a thread, while
        the event loop still runs)."""
        original = engine_client.shutdown
        loop_thread = threading.get_ident()

        def shutdown(*args, **kwargs):
            if threading.get_ident() != loop_thread and loop.is_running():
                try:                             # the stop, or the wait for one under way
                    asyncio.run_coroutine_threadsafe(self.stop_shadow(), loop
                                                     ).result(STOP_TIMEOUT_S + 5)
                except BaseException as e:       # the loop ended meanwhile: go on stopping
                    log.warning("shadow: sessions not written at the stop: %r", e)
            elif not self._stopped:
                log.warning("shadow: vLLM stopped its engine after its event loop ended: the "
                            "sessions were not written")
            return original(*args, **kwargs)
        engine_client.shutdown = shutdown

    async def _refresh_metrics(self) -> None:
        """Every METRICS_EVERY_S: the shadows' metrics (the ranks' merged: server.ranks) and a
        history sample."""
        while True:
            replies = await self.call_all_async("metrics", {})
            reply = replies[0]
            self.metrics = merge_metrics(replies) if self.engines else \
                (reply[1] if reply[0] == "ok" else None)
            if self.metrics is not None:              # this process's own: how replies came
                self.metrics = {**self.metrics, "answer_replies": dict(self.box.num_replies)}
            try:
                self.history.add(flatten(self.collector))
            except Exception:                # a sample lost; the refresh goes on
                log.exception("shadow: a history sample failed")
            not_running = reply[0] == "error" and reply[2][0] == NOT_RUNNING
            await asyncio.sleep(METRICS_IDLE_S if not_running else METRICS_EVERY_S)
