"""The HTTP API (FastAPI): host events, questions, status and metrics. Every route reaches the
reader through the service's facade (facade.Shadow), whose methods take the one lock.

Safe by default: binds 127.0.0.1 (cli), a bearer key when configured on every route but
/healthz, bodies over max_body_bytes -> 413, id lists over max_ids -> 413, session ids in paths
must match [A-Za-z0-9._:-]{1,128} (400), unknown sessions -> 404, bad values -> 400 or 422
naming the field, a question while the model loads -> 503 with Retry-After, an ask with `wait`
that times out -> 504 with the backlog.
"""
from __future__ import annotations

import re
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPBearer
from prometheus_client import generate_latest

from ..chat import Renderer
from ..config import ServiceConfig
from . import schemas
from .docs import add_docs
from .facade import Fed, WaitTimeout
from .limits import LOOPBACK, Guard
from .service import NotReady, Service

SESSION_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
ERRORS = {400: {"description": "a bad value (ids outside the vocabulary, a bad session id, `at` "
                               "beyond the ids, an unknown profile)"},
          401: {"description": "missing or wrong API key (when the server has one)"},
          404: {"description": "unknown session"},
          403: {"description": "a cross-origin request, or a Host other than the loopback's on "
                            "a loopback bind"},
          413: {"description": "body or id list over the limit"},
          415: {"description": "a body not declared application/json"},
          503: {"description": "the model is loading (Retry-After)"},
          504: {"description": "`wait`: the reader did not catch up in time (with the backlog)"}}


def create_app(cfg: ServiceConfig) -> FastAPI:
    """The app; the model starts loading when the app starts (status shows the progress)."""
    svc = Service(cfg)
    renderer = Renderer.from_model_dir(None)

    @asynccontextmanager
    async def lifespan(app):
        svc.start()
        yield
        svc.close()

    # The Guard enforces the key; the scheme documents it (and gives /docs its Authorize button).
    security = [Depends(HTTPBearer(auto_error=False))] if cfg.api_key else []
    app = FastAPI(title="shadow-reader", version="0.1.0", lifespan=lifespan,
                  description="An exact incremental Qwen3.5 reader beside a serving engine: host "
                  "events, questions, status and metrics.", dependencies=security,
                  responses=ERRORS, docs_url=None)
    add_docs(app, app.title)
    app.state.service = svc

    loopback = cfg.bind_host in LOOPBACK
    app.add_middleware(Guard, max_body_bytes=cfg.max_body_bytes, api_key=cfg.api_key,
                       allowed_hosts=LOOPBACK if loopback else None)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc):
        """422 naming each field, without echoing the (possibly huge) input back."""
        errors = [{"loc": e.get("loc"), "msg": str(e.get("msg"))[:200], "type": e.get("type")}
                  for e in exc.errors()[:20]]
        return JSONResponse({"detail": errors}, 422)

    @app.exception_handler(NotReady)
    async def not_ready(request, exc):
        if svc.state == "failed":                # retrying cannot help: no Retry-After
            return JSONResponse({"detail": f"the model failed to load: {exc}; fix the "
                                           "configuration and restart the service"}, 503)
        return JSONResponse({"detail": f"model not ready: {exc}"}, 503,
                            headers={"Retry-After": "5"})

    @app.exception_handler(WaitTimeout)
    async def timed_out(request, exc):
        return JSONResponse({"detail": f"the reader has not caught up: {exc.why}",
                             "backlog": exc.backlog, "committed": exc.committed}, 504)

    @app.exception_handler(KeyError)
    async def unknown(request, exc):
        return JSONResponse({"detail": str(exc.args[0]) if exc.args else "unknown"}, 404)

    @app.exception_handler(ValueError)
    async def bad_value(request, exc):
        return JSONResponse({"detail": str(exc)}, 400)

    def session_id(sid: str) -> str:
        if not SESSION_RE.fullmatch(sid):
            raise HTTPException(400, "session id must match [A-Za-z0-9._:-]{1,128}")
        return sid

    def body_session(sid: str) -> str:
        if not SESSION_RE.fullmatch(sid):
            raise ValueError("session must match [A-Za-z0-9._:-]{1,128}")
        return sid

    def check_ids(ids: list[int], field: str) -> list[int]:
        if len(ids) > cfg.max_ids:
            raise HTTPException(413, f"{field}: {len(ids)} ids, at most {cfg.max_ids}")
        return ids

    def feed_out(fed: Fed) -> schemas.FeedOut:
        res = fed.result
        return schemas.FeedOut(first_difference=res.first_difference,
                               rolled_back_from=res.rolled_back_from,
                               rolled_back_to=res.rolled_back_to, backlog=res.backlog,
                               committed=fed.committed, num_ids=fed.num_ids)

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
        return feed_out(svc.require().output(sid, check_ids(body.ids, "ids")))

    @app.post("/v1/shadow/sessions/{sid}/round", response_model=schemas.SliceOut)
    def between_rounds(sid: str = Depends(session_id)):
        sl = svc.require().between_rounds(sid)          # 404 for an unknown session
        return schemas.SliceOut(kind=sl.kind, chunks=sum(n for _, n in sl.chunks), ms=sl.ms,
                                stop=sl.stop)

    @app.post("/v1/shadow/sessions/{sid}/end")
    def end(sid: str = Depends(session_id)):
        svc.require().end(sid)
        return {"ended": sid}

    @app.delete("/v1/shadow/sessions/{sid}")
    def delete(sid: str = Depends(session_id)):
        svc.require().delete(sid)                       # reader and scheduler alike
        return {"deleted": sid}

    @app.get("/v1/shadow/sessions/{sid}/narration")
    def narration(sid: str = Depends(session_id)):
        return svc.require().narration(sid)

    @app.post("/v1/shadow/host")
    def host_signal(body: schemas.HostIn):
        svc.busy = body.busy
        return {"busy": svc.busy}

    @app.post("/v1/shadow/ask", response_model=schemas.AskOut)
    @app.post("/v1/conductor/shadow/ask", response_model=schemas.AskOut, include_in_schema=False)
    def ask(body: schemas.AskIn):
        shadow = svc.require()
        body_session(body.session)
        at = shadow.fork_position(body.session, body.at)     # 404 / 400 before any wait
        if body.wait:
            shadow.wait_for(body.session, body.at, body.timeout_s)
        ans = shadow.ask(body.session, body.question, body.choices, body.at, at)
        return schemas.AskOut(label=ans.label, letter=ans.letter, probs=list(ans.probs),
                              ms=ans.ms, backlog=ans.backlog,
                              num_forwarded_tokens=ans.num_forwarded_tokens, at=ans.at,
                              beyond_max_positions=ans.beyond_max_positions)

    @app.post("/v1/shadow/summarize", response_model=schemas.SummarizeOut)
    def summarize(body: schemas.SummarizeIn):
        shadow = svc.require()
        body_session(body.session)
        text, gen = shadow.summarize(body.session, body.instruction, body.max_tokens, body.at)
        return schemas.SummarizeOut(text=text, ids=list(gen.ids), ms_per_token=gen.ms_per_token,
                                    prefill_ms=gen.prefill_ms)

    @app.get("/v1/shadow/status")
    @app.get("/v1/conductor/shadow/status", include_in_schema=False)
    def status():
        return svc.status()

    @app.get("/metrics")
    def metrics():
        return PlainTextResponse(generate_latest(svc.registry).decode())

    @app.get("/healthz")
    def healthz():
        body = {"ok": svc.state != "failed", "state": svc.state, "stage": svc.stage}
        if svc.state == "failed":                # a load that failed is not a live service
            return JSONResponse({**body, "error": svc.error}, 503)
        return body

    return app
