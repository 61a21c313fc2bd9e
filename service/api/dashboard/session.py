"""Signing in to the dashboard: an API key held in an HttpOnly, SameSite=Strict cookie.

A browser cannot send `Authorization: Bearer`, so the login page takes an API key once and keeps it in a
cookie that page scripts cannot read (HttpOnly), that other sites' requests never carry (SameSite=Strict),
that only /dashboard receives (Path), and that is Secure whenever the dashboard is served over HTTPS. The
key never appears in a URL. Each request checks it exactly as the /v1 API checks a bearer key (same
cache, so a revoked key stops working within seconds), with the same scopes: `read` to see anything,
`submit` to cancel, `admin` to manage keys.

Forms are protected against cross-site requests twice: the cookie is SameSite=Strict, and every POST must
carry an Origin (or, failing that, a Referer) naming this very host.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated
from urllib.parse import parse_qs, urlsplit

from fastapi import Depends, Request, Response

from service.api.auth import ANONYMOUS_ADMIN, allows, key_for
from service.models.auth import ApiKeyView, Scope
from service.settings import get_settings

COOKIE = "kf_dashboard_key"
PATH = "/dashboard"
MAX_AGE_S = 12 * 3600
MAX_FORM_BYTES = 16 * 1024


class DashboardError(Exception):
    """Shown as a page (or, under /dashboard/api, as JSON); 401 sends a browser to the login page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def signed_in(request: Request) -> ApiKeyView | None:
    if not get_settings().auth_enabled:
        return ANONYMOUS_ADMIN
    secret = request.cookies.get(COOKIE)
    return await key_for(secret) if secret else None


def needs(scope: Scope) -> Callable[[Request], Awaitable[ApiKeyView]]:
    async def check(request: Request) -> ApiKeyView:
        who = await signed_in(request)
        if who is None:
            raise DashboardError(401, "sign in with an API key")
        if not allows(who, scope):
            raise DashboardError(403, f"this API key lacks the '{scope.value}' scope")
        return who

    return check


Reader = Annotated[ApiKeyView, Depends(needs(Scope.read))]
Submitter = Annotated[ApiKeyView, Depends(needs(Scope.submit))]
Admin = Annotated[ApiKeyView, Depends(needs(Scope.admin))]


def same_origin(request: Request) -> None:
    """Refuse a POST that another site's page could have sent (CSRF), beyond what SameSite already stops."""
    source = request.headers.get("origin") or request.headers.get("referer")
    host = request.headers.get("host")
    if not source or source == "null" or not host or urlsplit(source).netloc != host:
        raise DashboardError(403, "cross-site request refused: the form must be sent from this dashboard")


SameOrigin = Depends(same_origin)


async def form(request: Request) -> dict[str, list[str]]:
    """A urlencoded form body (the dashboard's forms are small; no multipart parser needed)."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise DashboardError(413, f"form larger than {MAX_FORM_BYTES} bytes")
    try:
        return parse_qs(body.decode(), max_num_fields=32)
    except (UnicodeDecodeError, ValueError) as exc:
        raise DashboardError(400, f"unreadable form: {exc}") from exc


def field(data: dict[str, list[str]], name: str, max_len: int = 200) -> str:
    value = (data.get(name) or [""])[0].strip()
    if len(value) > max_len:
        raise DashboardError(422, f"field '{name}' is longer than {max_len} characters")
    return value


def safe_next(target: str | None) -> str:
    """Where to go after signing in: only a path inside the dashboard (never another site)."""
    if target and target.startswith(PATH + "/") and "//" not in target and "\\" not in target:
        return target
    return f"{PATH}/jobs"


def _over_https(request: Request) -> bool:
    return request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https"


def keep_key(request: Request, response: Response, secret: str) -> None:
    response.set_cookie(
        COOKIE, secret, max_age=MAX_AGE_S, path=PATH, httponly=True, samesite="strict", secure=_over_https(request)
    )


def forget_key(response: Response) -> None:
    response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="strict")


# A key created on the keys page is shown once, on the page the form's POST redirects to (so reloading that page
# creates nothing). Its secret travels there in a cookie as guarded as the sign-in cookie, sent only to the keys
# page, for a minute at most, and dropped by the page that shows it: never in a URL, never stored server-side.
NEW_KEY_COOKIE = "kf_new_key"
NEW_KEY_PATH = f"{PATH}/keys"
NEW_KEY_MAX_AGE_S = 60


def hand_over_new_key(request: Request, response: Response, secret: str) -> None:
    response.set_cookie(
        NEW_KEY_COOKIE,
        secret,
        max_age=NEW_KEY_MAX_AGE_S,
        path=NEW_KEY_PATH,
        httponly=True,
        samesite="strict",
        secure=_over_https(request),
    )


def new_key_secret(request: Request) -> str | None:
    return request.cookies.get(NEW_KEY_COOKIE) or None


def drop_new_key(response: Response) -> None:
    response.delete_cookie(NEW_KEY_COOKIE, path=NEW_KEY_PATH, httponly=True, samesite="strict")
