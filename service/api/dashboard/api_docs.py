"""/docs: Swagger UI for the API, served entirely by this service, so it works offline (no CDN).

Swagger UI's script and stylesheet are the copies of swagger-ui-dist that the `fastapi-offline` package ships
(a 5.x release: OpenAPI 3.1, which FastAPI emits, needs Swagger UI 5). The page is FastAPI's own
`get_swagger_ui_html`; its one inline script, which starts Swagger UI, carries a nonce that this response's
Content-Security-Policy names, so the policy otherwise stays the dashboard's: nothing from elsewhere. ReDoc is
not served (the app sets `redoc_url=None`): its bundle injects inline styles that this policy refuses.
"""

from __future__ import annotations

import functools
import secrets
from importlib.resources import files

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

from service.api.dashboard import render
from service.api.dashboard.session import PATH
from service.api.deps import not_found

DOCS = "/docs"
ASSETS = f"{DOCS}/assets"
SWAGGER_JS, SWAGGER_CSS = "swagger-ui-bundle.js", "swagger-ui.css"
INLINE_SCRIPT = "<script>"  # get_swagger_ui_html's inline script: the only <script> tag without attributes

router = APIRouter(include_in_schema=False)


@functools.cache
def swagger_assets() -> dict[str, render.Asset]:
    return render.files_in(files("fastapi_offline") / "static", {SWAGGER_JS, SWAGGER_CSS})


@router.get(DOCS)
def swagger_ui(request: Request) -> HTMLResponse:
    nonce = secrets.token_urlsafe(18)
    page = get_swagger_ui_html(
        openapi_url=request.app.openapi_url,
        title=f"{request.app.title} API",
        swagger_js_url=f"{ASSETS}/{SWAGGER_JS}",
        swagger_css_url=f"{ASSETS}/{SWAGGER_CSS}",
        swagger_favicon_url=f"{PATH}/static/favicon.svg",
    )
    html = bytes(page.body).decode().replace(INLINE_SCRIPT, f'<script nonce="{nonce}">')
    headers = {**render.SECURITY_HEADERS, "Content-Security-Policy": render.content_security_policy(nonce)}
    return HTMLResponse(html, headers=headers)


@router.get(f"{ASSETS}/{{name}}")
def swagger_asset(name: str, request: Request) -> Response:
    found = render.static(request, name, swagger_assets())
    if found is None:
        not_found(f"no docs asset {name!r}")
    return found
