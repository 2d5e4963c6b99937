"""The HTTP API (FastAPI): host events, questions, status and metrics. Every route reaches the
reader through the service's facade (facade.Shadow), whose methods take the one lock.

Safe by default: binds 127.0.0.1 (cli), a bearer key when configured on every route but
/healthz and the dashboard's page (which holds no data: its JSON routes need the key), bodies
over max_body_bytes -> 413, id lists over max_ids -> 413, session ids in paths must match
[A-Za-z0-9._:-]{1,128} (400), unknown sessions -> 404, bad values -> 400 or 422 naming the
field, a question while the model loads -> 503 with Retry-After, an ask with `wait` that times
out -> 504 with the backlog.
"""
from __future__ import annotations

import importlib.metadata
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPBearer
from prometheus_client import generate_latest

from shadow_plugin.chat.renderer import Renderer
from shadow_plugin.reader.conflicts import Conflict
from shadow_plugin.server import errors, schemas
from shadow_plugin.server.ask_pool import AskPool
from shadow_plugin.server.config import ServiceConfig
from shadow_plugin.server.dashboard import PAGE_PATHS, dashboard_router
from shadow_plugin.server.docs import add_docs
from shadow_plugin.server.errors import NotDurable, NotReady, WaitTimeout
from shadow_plugin.server.facade import Fed
from shadow_plugin.server.limits import LOOPBACK, Guard
from shadow_plugin.server.routes import question_router, session_id
from shadow_plugin.server.service import Service


def package_version() -> str:
    """The installed distribution's version (the OpenAPI document's), "unknown" when the
    package runs from a tree that is not installed."""
    try:
        return importlib.metadata.version("shadow-reader")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


ERRORS = {400: {"description": "a bad value (ids outside the vocabulary, a bad session id, `at` "
                               "beyond the ids, an unknown profile)"},
          401: {"description": "missing or wrong API key (when the server has one)"},
          404: {"description": "unknown session (or one whose file was refused at start-up: "
                            "the reason is given)"},
          409: {"description": "outputs for a stale session, or at another position than the "
                            "ids held: send the turn again"},
          403: {"description": "a cross-origin request, or a Host other than the loopback's on "
                            "a loopback bind"},
          413: {"description": "body or id list over the limit"},
          429: {"description": "the question pool and its queue are full (Retry-After)"},
          415: {"description": "a body not declared application/json"},
          503: {"description": "the model is loading, or the disk refused the session's "
                            "manifest (Retry-After)"},
          504: {"description": "`wait`: the reader did not catch up in time (with the backlog)"}}


def create_app(cfg: ServiceConfig) -> FastAPI:
    """The app; the model starts loading when the app starts (status shows the progress)."""
    svc = Service(cfg)
    renderer = Renderer.from_model_dir(None)

    @asynccontextmanager
    async def lifespan(app):
        svc.start()
        yield
        app.state.ask_pool.close()
        svc.close()

    # The Guard enforces the key; the scheme documents it (and gives /docs its Authorize button).
    security = [Depends(HTTPBearer(auto_error=False))] if cfg.api_key else []
    app = FastAPI(title="shadow-reader", version=package_version(), lifespan=lifespan,
                  description="An exact incremental Qwen3.5 reader beside a serving engine: host "
                  "events, questions, status and metrics.", dependencies=security,
                  responses=ERRORS, docs_url=None)
    add_docs(app, app.title)
    app.state.service = svc

    loopback = cfg.bind_host in LOOPBACK
    app.add_middleware(Guard, max_body_bytes=cfg.max_body_bytes, api_key=cfg.api_key,
                       allowed_hosts=LOOPBACK if loopback else None,
                       # the page's paths with a trailing slash too: the router redirects them
                       open_paths=frozenset(("/healthz", *PAGE_PATHS,
                                             *(p + "/" for p in PAGE_PATHS))))

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc):
        """422 naming each field, without echoing the (possibly huge) input back: `detail` a
        line as for every other error, `errors` the fields one by one."""
        found = [{"loc": e.get("loc"), "msg": str(e.get("msg"))[:200], "type": e.get("type")}
                  for e in exc.errors()[:20]]
        line = "; ".join(f"{'.'.join(str(x) for x in f['loc'] or ())}: {f['msg']}"
                         for f in found)
        return JSONResponse({"detail": line, "errors": found}, 422)

    @app.exception_handler(NotReady)
    @app.exception_handler(NotDurable)
    @app.exception_handler(Conflict)
    @app.exception_handler(WaitTimeout)
    @app.exception_handler(KeyError)
    @app.exception_handler(ValueError)
    async def shadow_error(request, exc):
        return errors.answer(exc)

    def check_ids(ids: list[int], field: str) -> list[int]:
        if len(ids) > cfg.max_ids:
            raise HTTPException(413, f"{field}: {len(ids)} ids, at most {cfg.max_ids}")
        return ids

    def feed_out(fed: Fed) -> schemas.FeedOut:
        res = fed.result
        return schemas.FeedOut(first_difference=res.first_difference,
                               rolled_back_from=res.rolled_back_from,
                               rolled_back_to=res.rolled_back_to, backlog=res.backlog,
                               committed=fed.committed, num_ids=fed.num_ids,
                               durable=res.durable)

    @app.post("/v1/shadow/sessions/{sid}/turn", response_model=schemas.FeedOut)
    def turn(body: schemas.TurnIn, sid: str = Depends(session_id)):
        shadow = svc.require()
        if body.messages is not None:
            text = renderer.render(body.messages, body.tools, add_generation_prompt=True)
            ids = svc.tokenizer.encode(text)
        else:
            ids = body.prompt_ids
        fed = shadow.turn(sid, check_ids(ids, "prompt_ids"), body.profile, body.router_label)
        return schemas.FeedOut(followed=False) if fed is None else feed_out(fed)

    @app.post("/v1/shadow/sessions/{sid}/output", response_model=schemas.FeedOut)
    def output(body: schemas.OutputIn, sid: str = Depends(session_id)):
        fed = svc.require().output(sid, check_ids(body.ids, "ids"), body.position)
        return schemas.FeedOut(followed=False) if fed is None else feed_out(fed)

    @app.post("/v1/shadow/sessions/{sid}/round", response_model=schemas.SliceOut)
    def between_rounds(sid: str = Depends(session_id)):
        sl = svc.require().between_rounds(sid)          # 404 for an unknown session
        return schemas.SliceOut(kind=sl.kind, chunks=sum(n for _, n in sl.chunks), ms=sl.ms,
                                stop=sl.stop)

    @app.post("/v1/shadow/sessions/{sid}/end")
    def end(sid: str = Depends(session_id)):
        return {"ended": sid, "followed": svc.require().end(sid)}

    @app.delete("/v1/shadow/sessions/{sid}")
    def delete(sid: str = Depends(session_id)):
        svc.require().delete(sid)                       # reader and scheduler alike
        return {"deleted": sid}

    @app.post("/v1/shadow/host")
    def host_signal(body: schemas.HostIn):
        svc.busy = body.busy
        return {"busy": svc.busy}

    pool = AskPool(cfg.ask_workers, cfg.ask_queue)
    app.state.ask_pool = pool
    app.include_router(question_router(svc, pool))   # ask, summarize, chat, status, ...
    app.include_router(dashboard_router(svc.history))   # the page (no key) and its history

    @app.get("/metrics")
    def metrics():
        return PlainTextResponse(generate_latest(svc.registry).decode())

    @app.get("/healthz")
    async def healthz():                     # in the event loop: no worker thread needed
        body = {"ok": svc.state != "failed", "state": svc.state, "stage": svc.stage}
        if svc.state == "failed":                # a load that failed is not a live service
            return JSONResponse({**body, "error": svc.error}, 503)
        return body

    return app
