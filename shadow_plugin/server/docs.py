"""The browsable API page at /docs: FastAPI's Swagger UI page, which loads its scripts from a
CDN, plus a note shown when they do not load (a machine without internet access), pointing to
/openapi.json, which this server always serves."""
from __future__ import annotations

from fastapi.openapi.docs import get_swagger_ui_html
from starlette.requests import Request
from starlette.responses import HTMLResponse

FALLBACK = """
<div id="offline" style="display:none;font-family:sans-serif;margin:2em">
  <h2>shadow-reader API</h2>
  <p>The Swagger UI scripts could not be loaded from their CDN (no internet access?).
  The OpenAPI document is served here: <a href="{openapi}">{openapi}</a>.</p>
</div>
<script>
  window.addEventListener("load", function () {{
    if (typeof SwaggerUIBundle === "undefined") {{
      document.getElementById("offline").style.display = "block";
    }}
  }});
</script>
"""


def add_docs(app, title: str) -> None:
    """Serve /docs with the offline note (behind the API key when there is one, as every
    route but /healthz)."""

    async def docs(request: Request) -> HTMLResponse:
        page = get_swagger_ui_html(openapi_url=app.openapi_url, title=f"{title} - docs")
        body = page.body.decode().replace(
            "</body>", FALLBACK.format(openapi=app.openapi_url) + "</body>")
        return HTMLResponse(body)

    app.add_route("/docs", docs, include_in_schema=False)
