"""The dashboard's pages and forms: jobs, a job, models, a model, the config store, the fleet, Gemmini, API keys,
signing in."""

from __future__ import annotations

import enum
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy.orm import Session

from service.api.auth import allows, clear_cache, key_for, key_from
from service.api.dashboard import render, views
from service.api.dashboard.session import (
    PATH,
    Admin,
    DashboardError,
    Reader,
    SameOrigin,
    Submitter,
    drop_new_key,
    field,
    forget_key,
    form,
    hand_over_new_key,
    keep_key,
    new_key_secret,
    safe_next,
    signed_in,
)
from service.api.deps import SessionDep
from service.api.routers.jobs import cancel
from service.api.routers.models import cancel as cancel_model
from service.models import JobState
from service.models.auth import ApiKeyCreate, Scope
from service.settings import get_settings
from service.store import jobs, keys, models

router = APIRouter(prefix=PATH, include_in_schema=False)

Hash = Annotated[str | None, Query(max_length=64, pattern=r"^[0-9a-f]*$")]
JobId = Annotated[str | None, Query(max_length=36, pattern=r"^[0-9a-f-]*$")]
Offset = Annotated[int, Query(ge=0, le=views.MAX_OFFSET, description="items to skip (the newest first)")]


def choice(value: str | None, allowed: type[enum.Enum] | list[str], name: str) -> str | None:
    """An optional filter from a form: '' means any; anything else must be one of `allowed` (a 422 otherwise)."""
    if not value:
        return None
    names = [m.value for m in allowed] if isinstance(allowed, type) else allowed
    if value not in names:
        raise DashboardError(422, f"field '{name}' must be one of {', '.join(names)}, not {value!r}")
    return value


def state_filter(value: str | None) -> JobState | None:
    picked = choice(value, JobState, "state")
    return JobState(picked) if picked else None


def see_other(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


def saved_then_see_other(session: Session, url: str) -> RedirectResponse:
    """After a form changed the store: commit, then redirect. The request's session commits only once the
    response is sent, and the browser's GET of `url` may come first: it must see the change."""
    session.commit()
    return see_other(url)


def pager(path: str, listing: dict[str, Any], **filters: str | None) -> dict[str, str | None]:
    """Links to the newer and the older page of a list, keeping its filters (None where there is no such page)."""

    def at(offset: int) -> str:
        query = urlencode({k: v for k, v in filters.items() if v} | ({"offset": str(offset)} if offset else {}))
        return f"{path}?{query}" if query else path

    offset, size = listing["offset"], listing["limit"]
    return {
        "newer": at(max(0, offset - size)) if offset else None,
        "older": at(offset + size) if offset + size <= views.MAX_OFFSET else None,  # shown while `more`
    }


@router.get("")
@router.get("/")
def home() -> RedirectResponse:
    return see_other(f"{PATH}/jobs")


@router.get("/static/{name}")
def static(name: str, request: Request) -> Response:
    found = render.static(request, name)
    if found is None:
        raise DashboardError(404, f"no static file {name!r}")
    return found


# -- signing in ---------------------------------------------------------------------------------------------


@router.get("/login")
async def login_page(request: Request, next: str | None = Query(None, max_length=300)) -> Response:
    if not get_settings().auth_enabled:
        return see_other(safe_next(next))
    return render.page(request, "login.html", await signed_in(request), next=safe_next(next), problem="", active="")


@router.post("/login", dependencies=[SameOrigin])
async def login(request: Request) -> Response:
    data = await form(request)
    secret, target = field(data, "key", 300), safe_next(field(data, "next", 300))
    try:  # counted against the address like a failed Bearer key: the form is no way around the throttle
        who = await key_from(request, secret) if secret else None
    except HTTPException as throttled:
        refused = render.page(request, "login.html", None, status=throttled.status_code, next=target,
                              problem=f"Too many failed sign-ins from this address: {throttled.detail}.",
                              active="")  # fmt: skip
        refused.headers.update(throttled.headers or {})
        return refused
    problem = ""
    if who is None:
        problem = "That key is not valid (or was revoked)." if secret else "Enter an API key."
    elif not allows(who, Scope.read):
        problem = "That key lacks the 'read' scope the dashboard needs."
    if problem:
        return render.page(request, "login.html", None, status=401 if who is None else 403, next=target,
                           problem=problem, active="")  # fmt: skip
    response = see_other(target)
    keep_key(request, response, secret)
    return response


@router.post("/logout", dependencies=[SameOrigin])
def logout() -> Response:
    response = see_other(f"{PATH}/login")
    forget_key(response)
    return response


# -- jobs -----------------------------------------------------------------------------------------------------


@router.get("/jobs")
def jobs_page(
    request: Request,
    session: SessionDep,
    who: Reader,
    kind: str | None = Query(None, max_length=32),
    target: Hash = None,
    state: str | None = Query(None, max_length=16),
    offset: Offset = 0,
) -> HTMLResponse:
    choices = views.filter_choices(session)
    wanted = state_filter(state)
    picked = {"kind": choice(kind, choices["kinds"], "kind"), "target": target or None, "state": wanted}
    listing = views.job_list(session, picked["kind"], picked["target"], wanted, offset)
    pages = pager(f"{PATH}/jobs", listing, kind=picked["kind"], target=picked["target"], state=state or None)
    return render.page(
        request, "jobs.html", who, active="jobs", listing=listing, choices=choices, picked=picked, pages=pages
    )


@router.get("/jobs/{job_id}")
def job_page(job_id: str, request: Request, session: SessionDep, who: Reader) -> HTMLResponse:
    row = jobs.get_row(session, job_id)
    if row is None:
        raise DashboardError(404, f"job {job_id} not found")
    feed = views.job_feed(session, row)
    owner = row.owner_key_id == who.id or allows(who, Scope.admin)
    return render.page(
        request, "job.html", who, active="jobs", feed=feed, may_cancel=owner and allows(who, Scope.submit)
    )


@router.post("/jobs/{job_id}/cancel", dependencies=[SameOrigin])
def cancel_from_page(job_id: str, session: SessionDep, who: Submitter) -> Response:
    try:
        cancel(session, job_id, who)  # the API's own rule: the submitting key, or an admin key
    except HTTPException as exc:
        raise DashboardError(exc.status_code, str(exc.detail)) from exc
    return saved_then_see_other(session, f"{PATH}/jobs/{job_id}")


# -- models ---------------------------------------------------------------------------------------------------


@router.get("/models")
def models_page(request: Request, session: SessionDep, who: Reader, offset: Offset = 0) -> HTMLResponse:
    listing = views.model_list(session, offset)
    pages = pager(f"{PATH}/models", listing)
    return render.page(request, "models.html", who, active="models", listing=listing, pages=pages)


@router.get("/models/{model_id}")
def model_page(model_id: str, request: Request, session: SessionDep, who: Reader) -> HTMLResponse:
    row = models.get_row(session, model_id)
    if row is None:
        raise DashboardError(404, f"model {model_id} not found")
    may_cancel = (row.owner_key_id == who.id or allows(who, Scope.admin)) and allows(who, Scope.submit)
    view = views.model_page(session, row)
    return render.page(request, "model.html", who, active="models", model=view, may_cancel=may_cancel)


@router.post("/models/{model_id}/cancel", dependencies=[SameOrigin])
def cancel_model_from_page(model_id: str, session: SessionDep, who: Submitter) -> Response:
    try:
        cancel_model(session, model_id, who)  # the API's own rule: the adding key, or an admin key
    except HTTPException as exc:
        raise DashboardError(exc.status_code, str(exc.detail)) from exc
    return saved_then_see_other(session, f"{PATH}/models/{model_id}")


# -- the config store, the fleet, Gemmini -----------------------------------------------------------------------


@router.get("/configs")
def configs_page(
    request: Request, session: SessionDep, who: Reader, workload: Hash = None, target: Hash = None
) -> HTMLResponse:
    store = views.config_store(session, workload or None, target or None)
    choices = views.filter_choices(session)
    workloads = views.workload_choices(session)
    picked = {"workload": workload or None, "target": target or None}
    return render.page(
        request, "configs.html", who, active="configs", store=store, choices=choices, workloads=workloads, picked=picked
    )


@router.get("/fleet")
def fleet_page(request: Request, session: SessionDep, who: Reader, days: int = Query(14, ge=1, le=90)) -> HTMLResponse:
    return render.page(request, "fleet.html", who, active="fleet", fleet=views.fleet_view(session, days), days=days)


@router.get("/gemmini")
def gemmini_page(request: Request, session: SessionDep, who: Reader, job: JobId = None) -> HTMLResponse:
    try:
        view = views.gemmini_view(session, job or None)
    except LookupError as exc:
        raise DashboardError(404, str(exc)) from exc
    return render.page(request, "gemmini.html", who, active="gemmini", gemmini=view)


# -- API keys (admin) -------------------------------------------------------------------------------------------


@router.get("/keys")
async def keys_page(request: Request, session: SessionDep, who: Admin) -> HTMLResponse:
    created = None
    secret = new_key_secret(request)
    if secret is not None:  # just created by this browser's form: shown on this page view only
        found = await key_for(secret)  # a revoked, unknown or forged secret shows nothing
        created = {"name": found.name, "scopes": found.scopes, "key": secret} if found else None
    response = render.page(request, "keys.html", who, active="keys", keys=keys.list_all(session), created=created,
                           problem="")  # fmt: skip
    if secret is not None:
        drop_new_key(response)
    return response


@router.post("/keys", dependencies=[SameOrigin])
async def create_key(request: Request, session: SessionDep, who: Admin) -> Response:
    data = await form(request)
    try:
        body = ApiKeyCreate(name=field(data, "name", 100), scopes=[Scope(s) for s in data.get("scopes", [])])
    except ValueError as exc:  # pydantic's ValidationError and an unknown scope both name the field
        return render.page(request, "keys.html", who, status=422, active="keys", keys=keys.list_all(session),
                           created=None, problem=str(exc))  # fmt: skip
    created = keys.create(session, body.name, body.scopes)
    response = saved_then_see_other(session, f"{PATH}/keys")  # a reload of the page it shows creates nothing
    hand_over_new_key(request, response, created.key)
    return response


@router.post("/keys/{key_id}/revoke", dependencies=[SameOrigin])
def revoke_key(key_id: str, session: SessionDep, _: Admin) -> Response:
    if keys.revoke(session, key_id) is None:
        raise DashboardError(404, f"key {key_id} not found")
    response = saved_then_see_other(session, f"{PATH}/keys")
    clear_cache()  # after the commit: a lookup in between would cache the key as still active
    return response
