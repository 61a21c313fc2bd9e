"""Authentication (API keys) and authorization (scopes), as FastAPI dependencies."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, NoReturn

from fastapi import Depends, Header, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from service.api.limits import client_address, too_many
from service.api.state import auth_failure_bucket
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
    request: Request,
    authorization: Annotated[str | None, Header(description="Bearer <API key>")] = None,
    x_api_key: Annotated[str | None, Header(description="the API key, as an alternative header")] = None,
) -> ApiKeyView:
    if not get_settings().auth_enabled:
        return ANONYMOUS_ADMIN
    secret = x_api_key
    if authorization:
        scheme, _, value = authorization.partition(" ")
        secret = value.strip() if scheme.lower() == "bearer" else ""
        if not secret:
            _failed(_address(request), "Authorization must be 'Bearer <API key>'")
    if not secret:  # nothing presented, nothing guessed and no store query: not counted as a failure
        raise HTTPException(401, "an API key is required (Authorization: Bearer <key>)", {"WWW-Authenticate": "Bearer"})
    found = await key_from(request, secret)
    if found is None:
        raise HTTPException(401, "invalid or revoked API key", {"WWW-Authenticate": "Bearer"})
    return found


async def key_from(request: Request, secret: str) -> ApiKeyView | None:
    """The active key with this secret, or None (counted as a failed authentication of the request's address; the
    API's Bearer check and the dashboard's sign-in form both go through here). 429 past the address's limit."""
    digest = keys.hash_key(secret)
    hit, found = _cached(digest)
    if found is not None:  # a key known to be good passes even from an address that is being throttled
        return found
    address = _address(request)
    if wait := auth_failure_bucket().wait(address):
        # before the store is asked: a throttled address costs no query, whatever key it sends
        raise _throttled(wait)
    if not hit:
        found = await run_in_threadpool(_load, secret, digest)
    if found is None and (wait := auth_failure_bucket().take(address)):
        raise _throttled(wait)
    return found


def _address(request: Request) -> str:
    # behind a reverse proxy this is the proxy's address unless uvicorn trusts its X-Forwarded-For
    # (FORWARDED_ALLOW_IPS names the proxy): see docs/deployment.md
    return client_address(request.client.host if request.client else None)


def _failed(address: str, detail: str) -> NoReturn:
    """401 for a key that did not authenticate, counted against the client's address; 429 past the limit."""
    if wait := auth_failure_bucket().take(address):
        raise _throttled(wait)
    raise HTTPException(401, detail, {"WWW-Authenticate": "Bearer"})


def _throttled(wait_s: float) -> HTTPException:
    return too_many(
        f"too many failed authentications from this address (KERNELFLEET_AUTH_FAILURES_PER_MINUTE); "
        f"retry in {wait_s:.1f} s",
        wait_s,
    )


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
