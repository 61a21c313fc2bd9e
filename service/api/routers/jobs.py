"""Tuning jobs: submit, inspect, list, cancel."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Response, status
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from kernelfleet.models import JobList
from service.api.auth import ReadKey, SubmitKey
from service.api.deps import SessionDep, unprocessable
from service.api.documents import job_view
from service.api.limits import enforce
from service.api.lookup import AMBIGUOUS_PREFIX, ID_RULE, ReadableJob, find
from service.api.state import submit_bucket
from service.models import JobSpec, JobState, JobView
from service.models.auth import ApiKeyView, Scope
from service.settings import get_settings
from service.store import catalog, jobs
from service.store.tables import JobRow
from service.tuning.admission import check_job, check_kind, check_target
from service.tuning.kinds import Problem
from service.workers.submission import submit

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


class CandidateView(BaseModel):
    shape_key: str = Field(description="the shape measured, or the unit's range for a ukernel job (e.g. M=1..128)")
    config: dict[str, Any] = Field(description="format-tagged, e.g. a MetaSchedule trace or a uKernel tile")
    latency_s: float | None = Field(description="the tuner's own measurement (TVM's timing loop)")
    status: str
    error: str | None


def _refuse(problem: Problem | None, *under: str) -> None:
    if problem:
        unprocessable(["body", *under, *problem.loc], problem.message)


@router.post("", status_code=status.HTTP_202_ACCEPTED, summary="Submit a tuning job")
def submit_job(spec: JobSpec, session: SessionDep, response: Response, who: SubmitKey) -> JobView:
    enforce(submit_bucket(), who.id, "submissions")
    settings = get_settings()
    _refuse(check_kind(spec.kind))
    _refuse(check_target(spec.target), "target")
    if spec.target.is_host_alias:
        resolved = catalog.resolve_host_alias(session, spec.target, settings.worker_stale_after_s)
        if isinstance(resolved, str):
            unprocessable(["body", "target"], resolved)
        spec = spec.model_copy(update={"target": resolved})
    if isinstance(spec.workload, str):
        workload = catalog.get_workload(session, spec.workload)
        if workload is None:
            unprocessable(["body", "workload"], f"workload {spec.workload} is not registered")
    else:
        workload = catalog.put_workload(session, spec.workload)
    _refuse(check_job(spec.kind, workload, spec.distribution, spec.target, spec.budget, spec.tags))
    row = submit(session, spec, workload.workload_hash, owner_key_id=who.id)
    response.headers["Location"] = f"/v1/jobs/{row.id}"
    return job_view(session, row, live_queues(session))


def live_queues(session: Session) -> set[str]:
    return catalog.live_queues(session, get_settings().worker_stale_after_s)


@router.get(
    "/{job_id}",
    summary="State, progress and per-shape results of a job",
    description=ID_RULE,
    responses=AMBIGUOUS_PREFIX,
)
def get_job(row: ReadableJob, session: SessionDep) -> JobView:
    return job_view(session, row, live_queues(session))


@router.get("", summary="List jobs, newest first")
def list_jobs(
    session: SessionDep,
    _: ReadKey,
    state: JobState | None = None,
    kind: str | None = Query(None, max_length=32),
    workload: str | None = Query(None, max_length=64),
    limit: int = Query(50, ge=1, le=500),
    offset: int = Query(0, ge=0, le=1_000_000),
) -> JobList:
    rows, total = jobs.list_rows(session, state, kind, workload, limit, offset)
    live = live_queues(session)
    return JobList(jobs=[job_view(session, r, live) for r in rows], total=total)


@router.post(
    "/{job_id}/cancel", status_code=status.HTTP_202_ACCEPTED, summary="Cancel a job", responses=AMBIGUOUS_PREFIX
)
def cancel_job(job_id: str, session: SessionDep, who: SubmitKey) -> JobView:
    return job_view(session, cancel(session, job_id, who), live_queues(session))


def cancel(session: Session, job_id: str, who: ApiKeyView) -> JobRow:
    """Cancel as `who` (a key with the submit scope): its own jobs, or any job for an admin key. `job_id` may be
    a unique prefix."""
    row = jobs.get_row(session, find(session, JobRow, job_id, who))
    assert row is not None  # just resolved in this transaction
    if row.owner_key_id != who.id and Scope.admin not in who.scopes:
        raise HTTPException(403, "only the key that submitted a job, or an admin key, can cancel it")
    jobs.request_cancel(session, row.id)
    session.flush()
    return row


@router.get("/{job_id}/candidates", summary="Measured candidates of a job", responses=AMBIGUOUS_PREFIX)
def list_candidates(
    row: ReadableJob,
    session: SessionDep,
    limit: int = Query(100, ge=1, le=10_000),
    offset: int = Query(0, ge=0, le=1_000_000),
) -> list[CandidateView]:
    return [
        CandidateView(shape_key=c.shape_key, config=c.config, latency_s=c.latency_s, status=c.status, error=c.error)
        for c in jobs.candidates(session, row.id, limit, offset)
    ]
