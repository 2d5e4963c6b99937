"""ASGI guards that run before any route: the body-size cap (also for chunked bodies, which
carry no Content-Length) and the bearer key (compared in constant time)."""
from __future__ import annotations

import hmac
import json


async def _reply(send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """413 for bodies over `max_body_bytes` (declared or streamed); 401 without the right
    `Authorization: Bearer <key>` (scheme case-insensitive) on every path but /healthz."""

    def __init__(self, app, max_body_bytes: int, api_key: str | None):
        self.app, self.max_body_bytes, self.api_key = app, max_body_bytes, api_key

    def _authorized(self, headers: dict) -> bool:
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip(), self.api_key)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.api_key and scope["path"] != "/healthz" and not self._authorized(headers):
            return await _reply(send, 401, "missing or wrong API key (Authorization: Bearer)")
        size = headers.get(b"content-length", b"").decode()
        if size.isdigit() and int(size) > self.max_body_bytes:
            return await _reply(send, 413, f"body over {self.max_body_bytes} bytes")
        if size.isdigit() or scope["method"] in ("GET", "HEAD", "DELETE"):
            return await self.app(scope, receive, send)
        # A streamed body: read it here (at most the cap), then hand it on unchanged.
        messages, seen = [], 0
        while True:
            message = await receive()
            messages.append(message)
            seen += len(message.get("body", b""))
            if seen > self.max_body_bytes:
                return await _reply(send, 413, f"body over {self.max_body_bytes} bytes")
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        replay = iter(messages)

        async def replayed():
            return next(replay, None) or await receive()

        await self.app(scope, replayed, send)
