"""The shadow's errors and the HTTP answers they get, in one place for the standalone service's
handlers and the shared question routes (server.routes, also on vLLM's server, where an app-wide
handler for KeyError or ValueError would change vLLM's own routes): KeyError -> 404 (unknown
session), ValueError -> 400 (a bad value), WaitTimeout -> 504 with the backlog, NotReady -> 503
(Retry-After while the model loads, none after a failed load)."""
from __future__ import annotations

from fastapi.responses import JSONResponse


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


def answer(exc: Exception) -> JSONResponse | None:
    """The HTTP answer to one of the shadow's errors, or None for any other exception."""
    if isinstance(exc, NotReady):
        if exc.failed:                 # retrying cannot help: no Retry-After
            return JSONResponse({"detail": exc.why}, 503)
        return JSONResponse({"detail": f"model not ready: {exc}"}, 503,
                            headers={"Retry-After": "5"})
    if isinstance(exc, WaitTimeout):
        return JSONResponse({"detail": f"the reader has not caught up: {exc.why}",
                             "backlog": exc.backlog, "committed": exc.committed}, 504)
    if isinstance(exc, KeyError):
        return JSONResponse({"detail": str(exc.args[0]) if exc.args else "unknown"}, 404)
    if isinstance(exc, ValueError):
        return JSONResponse({"detail": str(exc)}, 400)
    return None
