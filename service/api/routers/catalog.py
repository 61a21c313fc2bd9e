"""Operators, workloads, targets and the workers that can tune them."""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter, Query, status
from pydantic import BaseModel

from service.api.auth import ReadKey, SubmitKey
from service.api.deps import SessionDep, not_found, unprocessable
from service.api.limits import enforce
from service.api.state import submit_bucket
from service.models import OPERATORS, Target, TargetSpec, Workload, WorkloadSpec
from service.store import catalog

router = APIRouter(prefix="/v1", tags=["catalog"])


class OperatorInfo(BaseModel):
    name: str
    description: str
    dims: list[str]
    attrs: dict[str, int | bool]


class WorkerInfo(BaseModel):
    name: str
    queues: list[str]
    target: Target
    started_at: dt.datetime
    last_seen: dt.datetime


@router.get("/operators", summary="The operator registry workloads are built from")
def list_operators(_: ReadKey) -> list[OperatorInfo]:
    return [
        OperatorInfo(name=o.name, description=o.description, dims=list(o.dims), attrs=dict(o.attrs))
        for o in OPERATORS.values()
    ]


@router.post("/workloads", status_code=status.HTTP_201_CREATED, summary="Register a workload (idempotent)")
def create_workload(spec: WorkloadSpec, session: SessionDep, who: SubmitKey) -> Workload:
    enforce(submit_bucket(), who.id, "submissions")
    return catalog.put_workload(session, spec)


@router.get("/workloads", summary="List registered workloads")
def list_workloads(
    session: SessionDep, _: ReadKey, limit: int = Query(100, ge=1, le=1000), offset: int = Query(0, ge=0, le=1_000_000)
) -> list[Workload]:
    return catalog.list_workloads(session, limit, offset)


@router.get("/workloads/{workload_hash}", summary="Get a workload by hash")
def get_workload(workload_hash: str, session: SessionDep, _: ReadKey) -> Workload:
    return catalog.get_workload(session, workload_hash) or not_found(f"workload {workload_hash} is not registered")


@router.post("/targets", status_code=status.HTTP_201_CREATED, summary="Register a target and get its fingerprint")
def create_target(spec: TargetSpec, session: SessionDep, _: ReadKey) -> Target:
    if spec.toolchain is None:
        unprocessable(["body", "toolchain"], "a target fingerprint needs the toolchain, e.g. {'tvm': '0.27.0.post1'}")
    return catalog.put_target(session, spec)


@router.get("/targets/{fingerprint}", summary="Get a target by fingerprint")
def get_target(fingerprint: str, session: SessionDep, _: ReadKey) -> Target:
    return catalog.get_target(session, fingerprint) or not_found(f"target {fingerprint} is not registered")


@router.get("/workers", summary="Workers seen by the store, newest first, with the hardware each tunes for")
def list_workers(session: SessionDep, _: ReadKey) -> list[WorkerInfo]:
    return [
        WorkerInfo(
            name=w.name,
            queues=w.queues,
            target=Target(**w.target, target_fingerprint=w.target_fingerprint),
            started_at=w.started_at,
            last_seen=w.last_seen,
        )
        for w in catalog.list_workers(session)
    ]
