"""The dashboard's routes, one definition for the standalone service (server.app) and for vLLM's
server (shadow_plugin.vllm.endpoint):

- GET /v1/shadow/dashboard (and /shadow/dashboard, outside the /v1 prefix that vLLM's
  `--api-key` guards, so the page loads there too): a self-contained page (static/dashboard.html
  with static/dashboard.js inlined; no CDN, no data, no key). It draws everything from the JSON
  routes below and /v1/shadow/status, under the server's auth rules: with a key set it asks for
  it once and sends it as a bearer token.
- GET /v1/shadow/history?since=T: the counters sampled over time (server.history.History).
"""
from __future__ import annotations

import base64
import hashlib
from importlib import resources

from fastapi import APIRouter, Query
from fastapi.responses import HTMLResponse

from shadow_plugin.server.history import History

PAGE_PATHS = ("/v1/shadow/dashboard", "/shadow/dashboard")
SCRIPTS = ("charts.js", "dashboard.js")     # inlined in this order


def csp(script: str) -> str:
    """The page may talk to its own server only and run only its own script (by its SHA-256):
    nothing loads from elsewhere (users may be offline)."""
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    return (f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; "
            "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def page_html() -> tuple[str, str]:
    """(the page: dashboard.html with SCRIPTS inlined where it says /*SCRIPT*/, its CSP)."""
    static = resources.files("shadow_plugin.server") / "static"
    html = (static / "dashboard.html").read_text(encoding="utf-8")
    script = "\n".join((static / name).read_text(encoding="utf-8") for name in SCRIPTS)
    script = f"\n{script}\n"
    return html.replace("\n/*SCRIPT*/\n", script), csp(script)


def dashboard_router(history: History) -> APIRouter:
    """The page and the history route over `history` (module doc)."""
    r = APIRouter()
    html, policy = page_html()            # read once: the package's files do not change

    def page():
        return HTMLResponse(html, headers={"Content-Security-Policy": policy,
                                           "Cache-Control": "no-cache",
                                           "X-Content-Type-Options": "nosniff"})

    for path in PAGE_PATHS:
        r.add_api_route(path, page, methods=["GET"], response_class=HTMLResponse,
                        include_in_schema=path == PAGE_PATHS[0],
                        summary="The live dashboard (a page; its data comes from the JSON "
                                "routes)")
        r.add_api_route(path, page, methods=["HEAD"], include_in_schema=False)

    @r.get("/v1/shadow/history")
    def history_route(since: float = Query(0.0, ge=0.0, description="unix time (s): only the "
                                           "samples taken after it"),
                      after: int = Query(0, ge=0, description="only the samples numbered "
                                         "after this `seq`"),
                      window_s: float | None = Query(None, gt=0.0, description="only the "
                                                     "samples of the last window_s s")):
        """The counters of /metrics sampled every `every_s` into a bounded ring: {now, started
        (this process's history: another value means the counters started again), every_s,
        max_samples, samples: [{seq, t, values: {prometheus name{labels}: value}}]}."""
        return history.answer(since, after, window_s)

    return r
