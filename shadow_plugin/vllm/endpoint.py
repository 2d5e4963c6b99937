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
one look a call, never in the engine.
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
from shadow_plugin.server.remote import RemoteService
from shadow_plugin.server.routes import question_router

log = logging.getLogger(__name__)
METRICS_EVERY_S = 1.0      # also the dashboard's sampling interval
HISTORY_SAMPLES = 3600
METRICS_IDLE_S = 30.0       # the next look when the shadow does not run
STOP_TIMEOUT_S = 120.0      # how long a planned stop waits for the shadow to write its sessions
NOT_RUNNING = ("the shadow does not run in vLLM's worker: start vLLM with --kv-transfer-config "
               "'{\"kv_connector\": \"ShadowConnector\", \"kv_role\": \"kv_producer\"}' and "
               "VLLM_PLUGINS=shadow")


class ShadowEndpoint:
    """vLLM's EndpointPlugin protocol: name, required_tasks, attach_router, init_state."""

    name = "shadow"
    required_tasks = ("generate",)

    def __init__(self):
        self.engine_client = None
        self.metrics: dict | None = None          # the last metrics fetched from the worker
        self.collector = Collector(lambda: self.metrics)
        self.history = History(METRICS_EVERY_S, HISTORY_SAMPLES)
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None    # the server's, at init_state
        self._loop_thread: int | None = None
        self._stopped = False                    # the shadow was told to stop (once)
        self._stopping: asyncio.Task | None = None   # that stop, which later callers await

    # -- the door's call, from a route's worker thread ------------------------------------------
    async def call_async(self, name: str, kwargs: dict):
        """serve_call's reply from rank 0's worker (the first reply that is not None)."""
        if self.engine_client is None:
            return ("error", "NotReady", ("vLLM's engine is not up", False))
        try:
            replies = await self.engine_client.collective_rpc("shadow_call",
                                                              args=(name, kwargs))
        except Exception as e:                # the engine dead or stopping: 503, not 500
            return ("error", "NotReady", (f"vLLM's engine did not answer: {e}", False))
        reply = next((r for r in replies or () if r is not None), None)
        return reply if reply is not None else ("error", "NotReady", (NOT_RUNNING, True))

    def call(self, name: str, kwargs: dict):
        """call_async from a worker thread (a route's, or the question pool's: any thread but
        the event loop's), run in the event loop vLLM's server runs."""
        if self._loop is None:
            return ("error", "NotReady", ("vLLM's engine is not up", False))
        if threading.get_ident() == self._loop_thread:
            raise RuntimeError("ShadowEndpoint.call on the event loop's own thread would wait "
                               "for itself: call it from a worker thread (or call_async)")
        return asyncio.run_coroutine_threadsafe(self.call_async(name, kwargs), self._loop).result()

    # -- vLLM's hooks ---------------------------------------------------------------------------
    def attach_router(self, app) -> None:
        cfg = ServiceConfig.from_env()
        app.include_router(question_router(RemoteService(self.call),
                                           AskPool(cfg.ask_workers, cfg.ask_queue)))
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
        try:
            reply = await asyncio.wait_for(self.call_async("stop", {}), STOP_TIMEOUT_S)
            if reply[0] != "ok":
                log.warning("shadow: sessions not written at the stop: %s", reply)
        except Exception as e:                   # the stop goes on without the shadow's files
            log.warning("shadow: sessions not written at the stop: %r", e)

    async def init_state(self, engine_client, state, args) -> None:
        self.engine_client = engine_client
        self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()
        if engine_client is None:            # vLLM's render-only server: no engine, no shadow
            return
        try:
            REGISTRY.register(self.collector)
        except ValueError:                   # registered by an earlier init in this process
            pass
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._refresh_metrics())
        self._stop_first(engine_client, loop)

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
        while True:
            reply = await self.call_async("metrics", {})
            self.metrics = reply[1] if reply[0] == "ok" else None
            try:
                self.history.add(flatten(self.collector))
            except Exception:                # a sample lost; the refresh goes on
                log.exception("shadow: a history sample failed")
            not_running = reply[0] == "error" and reply[2][0] == NOT_RUNNING
            await asyncio.sleep(METRICS_IDLE_S if not_running else METRICS_EVERY_S)
