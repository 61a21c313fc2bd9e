"""JSON the dashboard's pages poll for live state and progress (cookie-authenticated like the pages)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from service.api.dashboard import render, views
from service.api.dashboard.pages import Hash, Offset, state_filter
from service.api.dashboard.session import PATH, DashboardError, Reader
from service.api.deps import SessionDep
from service.store import jobs

router = APIRouter(prefix=f"{PATH}/api", include_in_schema=False)


@router.get("/jobs")
def job_list(
    session: SessionDep,
    _: Reader,
    kind: str | None = Query(None, max_length=32),
    target: Hash = None,
    state: str | None = Query(None, max_length=16),
    offset: Offset = 0,
) -> JSONResponse:
    body: dict[str, Any] = views.job_list(session, kind or None, target or None, state_filter(state), offset)
    return render.json_response(body)


@router.get("/jobs/{job_id}")
def job(job_id: str, session: SessionDep, _: Reader, known: str | None = Query(None, max_length=64)) -> JSONResponse:
    row = jobs.get_row(session, job_id)
    if row is None:
        raise DashboardError(404, f"job {job_id} not found")
    return render.json_response(views.job_feed(session, row, known))
