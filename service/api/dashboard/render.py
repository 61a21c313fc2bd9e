"""Pages from the package's Jinja2 templates, the package's static files, and the headers every page carries.

Everything the browser loads comes from this package (no CDN): the templates, one stylesheet, and two
scripts, `charts.js` (a small SVG chart module) and `dashboard.js` (live updates). The Content-Security-
Policy allows nothing else, so a page that tried to load anything from elsewhere would fail its tests. The
API's docs (/docs, `api_docs`) are served the same way, from an installed copy of Swagger UI.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
from collections.abc import Iterable
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, NamedTuple

from fastapi import Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from service import __version__
from service.api.auth import allows
from service.models.auth import ApiKeyView, Scope

HERE = Path(__file__).parent
STATIC = HERE / "static"
MEDIA_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}


def content_security_policy(script_nonce: str | None = None) -> str:
    """Nothing from elsewhere; inline scripts only where a page names them by a one-time nonce (/docs)."""
    scripts = f"'self' 'nonce-{script_nonce}'" if script_nonce else "'self'"
    return (
        f"default-src 'self'; script-src {scripts}; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'"
    )


SECURITY_HEADERS = {
    "Content-Security-Policy": content_security_policy(),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # same-origin forms keep their Referer: the CSRF check's fallback
    "Cache-Control": "no-store",
}

NAV = [("jobs", "Jobs"), ("models", "Models"), ("configs", "Config store"), ("fleet", "Fleet"), ("gemmini", "Gemmini")]


def seconds(value: float | None) -> str:
    """A latency for people: 12.3 µs, 4.56 ms, 1.2 s."""
    if value is None:
        return "–"
    if value == 0:
        return "0 s"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value * 1e9:.3g} ns"


def when(value: dt.datetime | None) -> str:
    return "–" if value is None else value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def as_json(value: Any) -> Markup:
    """JSON safe to embed in a <script type="application/json"> block (no `</script>` can close it)."""
    text = json.dumps(value, default=str).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return Markup(text)  # escaped above; the block is data, never executed


@functools.cache
def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(seconds=seconds, when=when, as_json=as_json)
    return env


def page(request: Request, template: str, who: ApiKeyView | None, *, status: int = 200, **context: Any) -> HTMLResponse:
    html = (
        environment()
        .get_template(template)
        .render(
            request=request,
            who=who,
            nav=NAV,
            version=__version__,
            can_submit=who is not None and allows(who, Scope.submit),
            is_admin=who is not None and allows(who, Scope.admin),
            **context,
        )
    )
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def error_page(request: Request, status: int, message: str, who: ApiKeyView | None) -> HTMLResponse:
    return page(request, "error.html", who, status=status, code=status, message=message, active="")


def json_response(body: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers={"Cache-Control": "no-store"})


class Asset(NamedTuple):
    data: bytes
    media_type: str
    etag: str


@functools.cache
def static_files() -> dict[str, Asset]:
    """The static files by name, read once: a fixed set, so a request can only ever get one of them."""
    return files_in(STATIC)


def files_in(folder: Traversable, names: Iterable[str] | None = None) -> dict[str, Asset]:
    """A folder's files the browser may load (those in `names`, or all), read once by the caller's cache."""
    found = {}
    for p in folder.iterdir():
        suffix = Path(p.name).suffix
        if suffix in MEDIA_TYPES and (names is None or p.name in names):
            data = p.read_bytes()
            found[p.name] = Asset(data, MEDIA_TYPES[suffix], f'"{hashlib.sha256(data).hexdigest()[:32]}"')
    return found


def static(request: Request, name: str, files: dict[str, Asset] | None = None) -> Response | None:
    """One of `files` (default: the dashboard's), revalidated by ETag on every load: a 304 while unchanged."""
    found = (static_files() if files is None else files).get(name)
    if found is None:
        return None
    headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff", "ETag": found.etag}
    if request.headers.get("if-none-match") == found.etag:
        return Response(status_code=304, headers=headers)
    return Response(found.data, media_type=found.media_type, headers=headers)
