"""The shadow's question routes, one definition for the standalone service (server.app) and for
vLLM's server (shadow_plugin.vllm.endpoint): ask, summarize, the OpenAI-shaped chat completion,
status, the sessions, a session's narration and its exactness check.

They reach the shadow through a door: an object with `status()` (works while the model loads)
and `require()` (the facade, or errors.NotReady): server.service.Service in the service's own
process, server.remote.RemoteService where the shadow lives in an engine's worker. Errors become
HTTP answers here (errors.answer), so the routes need no app-wide handlers.

The question routes run in the event loop: a waiting ask waits there (waits.Waits: no thread,
no lock), then the question runs in the bounded pool (ask_pool.AskPool: 429 past it), and a
client that disconnects stops both. Short calls (positions, status) run in worker threads.
"""
from __future__ import annotations

import functools
import math
import time
import uuid
from typing import Callable

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from starlette.concurrency import run_in_threadpool

from shadow_plugin.reader.conflicts import Conflict
from shadow_plugin.server import errors, schemas
from shadow_plugin.server.ask_pool import AskPool
from shadow_plugin.server.waits import Waits
from shadow_plugin.validate import HTTP_SESSION_RE

SESSION_RE = HTTP_SESSION_RE
ANSWERED = (KeyError, ValueError, Conflict, errors.NotReady, errors.WaitTimeout, errors.Busy,
            errors.ClientGone, errors.CatchUpTooLong)


def session_id(sid: str) -> str:
    """A session id in a path: [A-Za-z0-9._:-]{1,128}, else 400."""
    if not SESSION_RE.fullmatch(sid):
        raise HTTPException(400, "session id must match [A-Za-z0-9._:-]{1,128}")
    return sid


def body_session(sid: str) -> str:
    if not SESSION_RE.fullmatch(sid):
        raise ValueError("session must match [A-Za-z0-9._:-]{1,128}")
    return sid


def answered(fn: Callable) -> Callable:
    """The route's own errors as HTTP answers (errors.answer); others propagate."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ANSWERED as e:
            return errors.answer(e)
    return run


def answered_async(fn: Callable) -> Callable:
    """answered for a coroutine route."""
    @functools.wraps(fn)
    async def run(*args, **kwargs):
        try:
            return await fn(*args, **kwargs)
        except ANSWERED as e:
            return errors.answer(e)
    return run


def ask_out(ans) -> schemas.AskOut:
    return schemas.AskOut(label=ans.label, letter=ans.letter, probs=list(ans.probs), ms=ans.ms,
                          backlog=ans.backlog, num_forwarded_tokens=ans.num_forwarded_tokens,
                          at=ans.at, beyond_max_positions=ans.beyond_max_positions,
                          stale=ans.stale)


def server_timing(t0: float, answers) -> str:
    """The Server-Timing header of a question's reply (W3C Server Timing), in ms: `forward`,
    the answers' `ms` (their forks' forwards from the grid line below their position; the
    largest: several questions share one forward), and `server`, this route's time from its
    start (t0, time.perf_counter) to the reply (a wait, the pool, the catch-up reading of a
    backlog, a door's calls to an engine's worker and the forward). A client's time less
    `server` is HTTP's; `server` less `forward` is the server's own and the catch-up's
    (inside vLLM: the API process's hops to the engine's worker and back)."""
    forward_ms = max(a.ms for a in answers)
    server_ms = (time.perf_counter() - t0) * 1e3
    return f"forward;dur={forward_ms:.3f}, server;dur={server_ms:.3f}"


def letter_choice(index: int, ans) -> dict:
    """An answer as a chat.completion choice: the label as the message, the letters'
    logprobs."""
    lps = [{"token": chr(65 + i), "logprob": math.log(max(p, 1e-45))}
           for i, p in enumerate(ans.probs)]
    best = next(x for x in lps if x["token"] == ans.letter)
    return {"index": index, "message": {"role": "assistant", "content": ans.label},
            "finish_reason": "stop", "logprobs": {"content": [{**best, "top_logprobs": lps}]}}


class Questions:
    """What the question routes share: the door, its waits and its pool."""

    def __init__(self, door, pool: AskPool):
        self.door, self.pool, self.waits = door, pool, Waits(door)
        self._model: str | None = None     # the shadow's model, for chat.completion's `model`

    async def ask(self, request: Request | None, session: str, question: str,
                  choices: list[str], at: int | None, wait: bool = False,
                  timeout_s: float = 10.0):
        """With a wait: the position checked (404 / 400 before it), the wait (in the event
        loop), then the answer (in the pool); without: the answer (the position taken and
        checked in the pool's call: one call less to a remote door's engine), the position
        checked first only when every worker of the pool is taken, so an unknown session or a
        bad `at` is still a 404 / 400 at once, never after a wait in the queue or the pool's
        429."""
        return await self._answer(request, session, at, wait, timeout_s, "ask",
                                  question, choices)

    async def ask_many(self, request: Request | None, session: str, items: list,
                       at: int | None, wait: bool = False, timeout_s: float = 10.0):
        """As `ask`, for several (question, choices) pairs about one session: their answers
        in order, from one forward (facade.Shadow.ask_many; one place in the pool)."""
        return await self._answer(request, session, at, wait, timeout_s, "ask_many", items)

    async def _answer(self, request: Request | None, session: str, at: int | None,
                      wait: bool, timeout_s: float, method: str, *question):
        """shadow.<method>(session, *question, at, fork_at) in the pool, after the optional
        position check and wait (`ask`; fork_at None without a wait)."""
        shadow = self.door.require()
        body_session(session)
        gone = request.is_disconnected if request is not None else None
        fork_at = None                        # without a wait: taken in the answer's call
        if wait or self.pool.saturated:       # 404 / 400 / 503 now, not after a queue or 429
            fork_at = await run_in_threadpool(shadow.fork_position, session, at)
        if wait:
            await self.waits.wait(session, at, timeout_s, gone)
        return await self.pool.run(getattr(shadow, method), session, *question, at, fork_at,
                                   disconnected=gone)

    async def summarize(self, request: Request | None, session: str, instruction: str,
                        max_tokens: int, at: int | None):
        shadow = self.door.require()
        body_session(session)
        gone = request.is_disconnected if request is not None else None
        return await self.pool.run(shadow.summarize, session, instruction, max_tokens, at,
                                   disconnected=gone)

    async def chat_completion(self, request: Request, body: schemas.ChatIn,
                              response: Response | None = None) -> dict:
        """A chat.completion: with choices, the label as the message and the letters'
        logprobs; without, a summary decoded with the question as its instruction; `n` equal
        choices of it (computed once); with `questions`, choice i the answer to questions[i]
        (one forward for all; `shadow.answers` the AskOut of each). A question's reply
        carries Server-Timing (server_timing) on `response`. The model's name comes from the
        door's status once (inside vLLM a status is a call into the engine's worker that
        builds every session's stats: not one a question)."""
        t0 = time.perf_counter()
        if self._model is None:
            status = await run_in_threadpool(self.door.status)
            self._model = status.get("model") or None
        created, model = int(time.time()), f"shadow:{self._model or ''}"
        out = {"id": f"shadowcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
               "created": created, "model": model}
        if body.questions is not None:
            answers = await self.ask_many(request, body.session,
                                          [[q.question, q.choices] for q in body.questions],
                                          body.at, body.wait, body.timeout_s)
            choices = [letter_choice(i, ans) for i, ans in enumerate(answers)]
            out["shadow"] = schemas.AskManyOut(answers=[ask_out(a) for a in answers]).model_dump()
            usage = {"prompt_tokens": sum(a.num_forwarded_tokens for a in answers),
                     "completion_tokens": len(answers)}
            if response is not None:
                response.headers["Server-Timing"] = server_timing(t0, answers)
        elif body.choices:
            ans = await self.ask(request, body.session, body.question(), body.choices, body.at,
                                 body.wait, body.timeout_s)
            choices = [letter_choice(i, ans) for i in range(body.n or 1)]
            usage = {"prompt_tokens": ans.num_forwarded_tokens, "completion_tokens": 1}
            out["shadow"] = ask_out(ans).model_dump()
            if response is not None:
                response.headers["Server-Timing"] = server_timing(t0, [ans])
        else:
            text, gen = await self.summarize(request, body.session, body.question(),
                                             body.max_tokens, body.at)
            choices = [{"index": i, "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop" if len(gen.ids) < body.max_tokens else "length",
                        "logprobs": None} for i in range(body.n or 1)]
            out["shadow"] = {"stale": gen.stale, "at": gen.at}
            usage = {"prompt_tokens": max(gen.num_forwarded_tokens - (len(gen.ids) - 1), 0),
                     "completion_tokens": len(gen.ids)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return {**out, "choices": choices, "usage": usage}


def question_router(door, pool: AskPool) -> APIRouter:
    """The shared routes over `door` (module doc), questions through `pool`."""
    r, q = APIRouter(), Questions(door, pool)

    @r.post("/v1/shadow/ask", response_model=schemas.AskOut | schemas.AskManyOut)
    @r.post("/v1/conductor/shadow/ask", response_model=schemas.AskOut | schemas.AskManyOut,
            include_in_schema=False)
    @answered_async
    async def ask_route(body: schemas.AskIn, request: Request, response: Response):
        """One question (question, choices: an AskOut), or several about one session
        (questions: an AskManyOut, answers in order, from one forward); the reply's
        Server-Timing header says where its time went (server_timing)."""
        t0 = time.perf_counter()
        if body.questions is not None:
            answers = await q.ask_many(request, body.session,
                                       [[x.question, x.choices] for x in body.questions],
                                       body.at, body.wait, body.timeout_s)
            response.headers["Server-Timing"] = server_timing(t0, answers)
            return schemas.AskManyOut(answers=[ask_out(a) for a in answers])
        ans = await q.ask(request, body.session, body.question, body.choices, body.at,
                          body.wait, body.timeout_s)
        response.headers["Server-Timing"] = server_timing(t0, [ans])
        return ask_out(ans)

    @r.post("/v1/shadow/summarize", response_model=schemas.SummarizeOut)
    @answered_async
    async def summarize(body: schemas.SummarizeIn, request: Request):
        text, gen = await q.summarize(request, body.session, body.instruction, body.max_tokens,
                                      body.at)
        return schemas.SummarizeOut(text=text, ids=list(gen.ids), ms_per_token=gen.ms_per_token,
                                    prefill_ms=gen.prefill_ms, stale=gen.stale)

    @r.post("/v1/shadow/chat/completions")
    @answered_async
    async def chat(body: schemas.ChatIn, request: Request, response: Response):
        return await q.chat_completion(request, body, response)

    @r.get("/v1/shadow/status")
    @r.get("/v1/conductor/shadow/status", include_in_schema=False)
    @answered
    def status():
        return door.status()

    @r.get("/v1/shadow/sessions")
    @answered
    def sessions():
        return door.require().sessions()

    @r.get("/v1/shadow/sessions/{sid}/narration")
    @answered
    def narration(sid: str = Depends(session_id)):
        return door.require().narration(sid)

    @r.get("/v1/shadow/sessions/{sid}/check")
    @answered_async
    async def check(request: Request, sid: str = Depends(session_id)):
        """The session's committed state against a fresh prefill of its ids (a diagnostic: it
        reads the session again from 0, a chunk per hold of the shadow's lock, comparing the
        session as it was when the check began; in the question pool)."""
        shadow = door.require()
        return await pool.run(shadow.check, sid, disconnected=request.is_disconnected)

    return r
