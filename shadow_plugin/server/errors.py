"""The shadow's errors and the HTTP answers they get, in one place for the standalone service's
handlers and the shared question routes (server.routes, also on vLLM's server, where an app-wide
handler for KeyError or ValueError would change vLLM's own routes): KeyError -> 404 (unknown
session), ValueError -> 400 (a bad value), WaitTimeout -> 504 with the backlog, NotReady -> 503
(Retry-After while the model loads, none after a failed load), NotDurable -> 503 (Retry-After:
the disk refused a manifest), conflicts.Conflict -> 409 (a stale session, outputs at another
position), CatchUpTooLong -> 409 with the backlog, QuestionTooLong -> 413, Busy -> 429 with
Retry-After, ClientGone -> 499 (nobody reads it: the client left)."""
from __future__ import annotations

from fastapi.responses import JSONResponse

from shadow_plugin.reader.conflicts import Conflict, PositionMismatch, StaleSession


class NotReady(Exception):
    """The model is still loading, or the shadow cannot answer for good (`failed`: `why`
    says what to fix): the route answers 503 (Retry-After while loading)."""

    def __init__(self, why: str, failed: bool = False):
        super().__init__(why, failed)
        self.why, self.failed = why, failed

    def __str__(self) -> str:
        return self.why


class WaitTimeout(Exception):
    """An ask with `wait` whose session did not reach its line in time (504 with the backlog)."""

    def __init__(self, backlog: int, committed: int, why: str):
        super().__init__(backlog, committed, why)
        self.backlog, self.committed, self.why = backlog, committed, why


class NotDurable(Exception):
    """A turn, an end or outputs the shadow could not make durable: the session's manifest
    did not reach the disk (full, gone), so a restart would not find what the host sent (503
    with Retry-After; for outputs nothing was appended, so a retry is safe)."""

    def __init__(self, session: str, what: str):
        super().__init__(session, what)
        self.why = (f"session {session!r}: {what}, but its manifest could not be written to the "
                    f"disk (SHADOW_DISK full or gone; see the log and write_errors): retry")


class CatchUpTooLong(Exception):
    """A question that would first read `need` ids, past the bound (SHADOW_ASK_MAX_CATCHUP_TOKENS):
    refused before any reading (409 with the backlog), never answered from a partial read."""

    def __init__(self, session: str, need: int, bound: int, backlog: int, committed: int):
        super().__init__(session, need, bound, backlog, committed)
        self.session, self.need, self.bound = session, need, bound
        self.backlog, self.committed = backlog, committed


class QuestionTooLong(ValueError):
    """A question (or a summary's instruction) that renders to more ids than the bound
    (SHADOW_MAX_QUESTION_TOKENS): refused before any of it is read (413)."""

    def __init__(self, session: str, num_ids: int, bound: int):
        super().__init__(session, num_ids, bound)
        self.session, self.num_ids, self.bound = session, num_ids, bound

    def __str__(self) -> str:
        return (f"session {self.session!r}: the question renders to {self.num_ids} ids, over "
                f"the limit of {self.bound} (SHADOW_MAX_QUESTION_TOKENS): ask a shorter one")


class Busy(Exception):
    """The question pool and its queue are full (429 with Retry-After, in s)."""

    def __init__(self, why: str, retry_after_s: int = 1):
        super().__init__(why, retry_after_s)
        self.why, self.retry_after_s = why, retry_after_s


class ClientGone(Exception):
    """The client of a waiting or reading question disconnected: its work stops (499)."""


def answer(exc: Exception) -> JSONResponse | None:
    """The HTTP answer to one of the shadow's errors, or None for any other exception."""
    if isinstance(exc, NotReady):
        if exc.failed:                 # retrying cannot help: no Retry-After
            return JSONResponse({"detail": exc.why}, 503)
        return JSONResponse({"detail": f"model not ready: {exc}"}, 503,
                            headers={"Retry-After": "5"})
    if isinstance(exc, CatchUpTooLong):
        return JSONResponse({"detail": f"session {exc.session!r}: the question would first read "
                             f"{exc.need} ids, over the bound of {exc.bound} "
                             f"(SHADOW_ASK_MAX_CATCHUP_TOKENS): ask with `wait` once the reader "
                             f"caught up, or ask at an earlier `at`", "backlog": exc.backlog,
                             "committed": exc.committed, "need": exc.need}, 409)
    if isinstance(exc, Busy):
        return JSONResponse({"detail": exc.why}, 429,
                            headers={"Retry-After": str(exc.retry_after_s)})
    if isinstance(exc, ClientGone):
        return JSONResponse({"detail": "the client disconnected"}, 499)
    if isinstance(exc, NotDurable):
        return JSONResponse({"detail": exc.why}, 503, headers={"Retry-After": "5"})
    if isinstance(exc, Conflict):
        body = {"detail": str(exc), "session": exc.session}
        if isinstance(exc, StaleSession):
            body.update(stale=True, position=exc.position)
        elif isinstance(exc, PositionMismatch):
            body.update(position=exc.position, held=exc.held)
        return JSONResponse(body, 409)
    if isinstance(exc, WaitTimeout):
        return JSONResponse({"detail": f"the reader has not caught up: {exc.why}",
                             "backlog": exc.backlog, "committed": exc.committed}, 504)
    if isinstance(exc, QuestionTooLong):
        return JSONResponse({"detail": str(exc), "num_ids": exc.num_ids, "limit": exc.bound},
                            413)
    if isinstance(exc, KeyError):
        return JSONResponse({"detail": str(exc.args[0]) if exc.args else "unknown"}, 404)
    if isinstance(exc, ValueError):
        return JSONResponse({"detail": str(exc)}, 400)
    return None
