"""ASGI guards that run before any route: the body-size cap (also for chunked bodies, which
carry no Content-Length), the bearer key (compared in constant time), and what keeps a web page
in the user's browser from driving a local server: cross-origin requests are refused (a page
may send a bodiless POST such as /end without a preflight), and on a loopback bind the Host
header must name the loopback (DNS rebinding)."""
from __future__ import annotations

import hmac
import json
from urllib.parse import urlsplit

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def host_name(netloc: str) -> str:
    """'[::1]:8765' -> '::1', 'localhost:8765' -> 'localhost' (lower case)."""
    return (urlsplit(f"//{netloc}").hostname or "").lower()


async def _reply(send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if status == 401:                  # RFC 6750: say which scheme the server wants
        headers.append((b"www-authenticate", b'Bearer realm="shadow-reader"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """403 for a request whose Origin is not its own Host, or (allowed_hosts given: the bind is
    the loopback) whose Host is not one of allowed_hosts; 415 for a body that is not declared
    application/json; 413 for bodies over
    `max_body_bytes` (declared or streamed); 401 without the right `Authorization: Bearer
    <key>` (scheme case-insensitive) on every path but `open_paths` (default /healthz)."""

    def __init__(self, app, max_body_bytes: int, api_key: str | None,
                 allowed_hosts: frozenset | None = None,
                 open_paths: frozenset = frozenset({"/healthz"})):
        self.app, self.max_body_bytes, self.api_key = app, max_body_bytes, api_key
        self.allowed_hosts, self.open_paths = allowed_hosts, open_paths

    def _foreign(self, headers: dict) -> str | None:
        """Why the request comes from somewhere it must not, else None."""
        host = headers.get(b"host", b"").decode("latin-1")
        if self.allowed_hosts is not None and host and host_name(host) not in self.allowed_hosts:
            return f"Host {host!r} is not this loopback server's"
        origin = headers.get(b"origin", b"").decode("latin-1")
        if origin and origin != "null" and urlsplit(origin).netloc.lower() != host.lower():
            return f"cross-origin request from {origin!r} refused"
        if origin == "null":
            return "request from an opaque origin refused"
        return None

    def _authorized(self, headers: dict) -> bool:
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip(), self.api_key)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        why = self._foreign(headers)
        if why:
            return await _reply(send, 403, why)
        if (self.api_key and scope["path"] not in self.open_paths
                and not self._authorized(headers)):
            return await _reply(send, 401, "missing or wrong API key (Authorization: Bearer)")
        size = headers.get(b"content-length", b"").decode()
        has_body = (size.isdigit() and int(size) > 0) or b"transfer-encoding" in headers
        kind = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
        if has_body and scope["method"] in ("POST", "PUT", "PATCH") and kind != "application/json":
            return await _reply(send, 415, f"Content-Type must be application/json, got "
                                           f"{kind or 'none'} (curl: -H 'content-type: "
                                           f"application/json')")
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
