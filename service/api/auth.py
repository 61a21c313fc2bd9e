"""Authentication (API keys) and authorization (scopes), as FastAPI dependencies."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Header, HTTPException
from starlette.concurrency import run_in_threadpool

from service.models.auth import ApiKeyView, Scope
from service.settings import get_settings
from service.store import keys
from service.store.db import session_scope

_CACHE_TTL_S = 10.0  # a revoked key stops working within this long on every API process
_cache: dict[str, tuple[float, ApiKeyView | None]] = {}
_cache_lock = threading.Lock()


def _cached(digest: str) -> tuple[bool, ApiKeyView | None]:
    with _cache_lock:
        hit = _cache.get(digest)
    if hit and time.monotonic() - hit[0] < _CACHE_TTL_S:
        return True, hit[1]
    return False, None


def _load(secret: str, digest: str) -> ApiKeyView | None:
    with session_scope() as session:
        found = keys.authenticate(session, secret)
    with _cache_lock:
        if len(_cache) > 10_000:
            _cache.clear()
        _cache[digest] = (time.monotonic(), found)
    return found


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


ANONYMOUS_ADMIN = ApiKeyView(
    id="auth-disabled",
    name="auth disabled",
    prefix="",
    scopes=[Scope.admin],
    created_at=dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
    revoked_at=None,
)


async def principal(
    authorization: Annotated[str | None, Header(description="Bearer <API key>")] = None,
    x_api_key: Annotated[str | None, Header(description="the API key, as an alternative header")] = None,
) -> ApiKeyView:
    if not get_settings().auth_enabled:
        return ANONYMOUS_ADMIN
    secret = x_api_key
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() != "bearer" or not value:
            raise HTTPException(401, "Authorization must be 'Bearer <API key>'", {"WWW-Authenticate": "Bearer"})
        secret = value.strip()
    if not secret:
        raise HTTPException(401, "an API key is required (Authorization: Bearer <key>)", {"WWW-Authenticate": "Bearer"})
    found = await key_for(secret)
    if found is None:
        raise HTTPException(401, "invalid or revoked API key", {"WWW-Authenticate": "Bearer"})
    return found


async def key_for(secret: str) -> ApiKeyView | None:
    """The active key with this secret, or None (also the dashboard's check of its cookie)."""
    # async, so a cached key costs no thread-pool hop; only a cache miss goes to the store
    digest = keys.hash_key(secret)
    hit, found = _cached(digest)
    if not hit:
        found = await run_in_threadpool(_load, secret, digest)
    return found


def allows(who: ApiKeyView, scope: Scope) -> bool:
    return scope in who.scopes or Scope.admin in who.scopes


Principal = Annotated[ApiKeyView, Depends(principal)]


def require(scope: Scope) -> Callable[[ApiKeyView], Awaitable[ApiKeyView]]:
    """A dependency that admits keys holding `scope` (or admin)."""

    async def check(who: Principal) -> ApiKeyView:
        if not allows(who, scope):
            raise HTTPException(403, f"this API key lacks the '{scope.value}' scope")
        return who

    return check


ReadKey = Annotated[ApiKeyView, Depends(require(Scope.read))]
SubmitKey = Annotated[ApiKeyView, Depends(require(Scope.submit))]
TelemetryKey = Annotated[ApiKeyView, Depends(require(Scope.telemetry))]
AdminKey = Annotated[ApiKeyView, Depends(require(Scope.admin))]
