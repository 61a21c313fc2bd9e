"""Operators, workloads, targets and the workers that can tune them."""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter, Query, status
from pydantic import BaseModel, Field

from kernelfleet.models import KindInfo, PlatformInfo, Target, Workload
from service.api.auth import ReadKey, SubmitKey
from service.api.deps import SessionDep, not_found, unprocessable
from service.api.limits import enforce
from service.api.state import submit_bucket, target_bucket
from service.models import OPERATORS, TargetSpec, WorkloadSpec
from service.settings import get_settings
from service.store import catalog
from service.tuning.admission import check_target
from service.tuning.kinds import KINDS
from service.tuning.platforms import PLATFORMS

router = APIRouter(prefix="/v1", tags=["catalog"])


class OperatorInfo(BaseModel):
    name: str
    description: str
    dims: list[str]
    attrs: dict[str, int | bool | str] = Field(description="attribute name -> default")
    choices: dict[str, list[str]] = Field(default_factory=dict, description="the values a str attribute may take")


class WorkerInfo(BaseModel):
    name: str
    queues: list[str]
    target: Target
    started_at: dt.datetime
    last_seen: dt.datetime
    online: bool = Field(description="heartbeats arrived within KERNELFLEET_WORKER_STALE_AFTER_S")


@router.get("/operators", summary="The operator registry workloads are built from")
def list_operators(_: ReadKey) -> list[OperatorInfo]:
    return [
        OperatorInfo(
            name=o.name,
            description=o.description,
            dims=list(o.dims),
            attrs=dict(o.attrs),
            choices={k: list(v) for k, v in o.choices.items()},
        )
        for o in OPERATORS.values()
    ]


@router.get("/kinds", summary="The job kinds this service runs")
def list_kinds(_: ReadKey) -> list[KindInfo]:
    return [
        KindInfo(name=k.name, summary=k.summary, target_kinds=sorted(k.target_kinds), publishes=k.publishes)
        for k in KINDS.all()
    ]


@router.get("/platforms", summary="The hardware platforms this service knows")
def list_platforms(_: ReadKey) -> list[PlatformInfo]:
    return [PlatformInfo(name=name, summary=PLATFORMS.get(name).summary) for name in PLATFORMS.names()]


@router.post("/workloads", status_code=status.HTTP_201_CREATED, summary="Register a workload (idempotent)")
def create_workload(spec: WorkloadSpec, session: SessionDep, who: SubmitKey) -> Workload:
    enforce(submit_bucket(), who.id, "submissions")
    return Workload.model_validate(catalog.put_workload(session, spec).model_dump())


@router.get("/workloads", summary="List registered workloads")
def list_workloads(
    session: SessionDep, _: ReadKey, limit: int = Query(100, ge=1, le=1000), offset: int = Query(0, ge=0, le=1_000_000)
) -> list[Workload]:
    return [Workload.model_validate(w.model_dump()) for w in catalog.list_workloads(session, limit, offset)]


@router.get("/workloads/{workload_hash}", summary="Get a workload by hash")
def get_workload(workload_hash: str, session: SessionDep, _: ReadKey) -> Workload:
    found = catalog.get_workload(session, workload_hash) or not_found(f"workload {workload_hash} is not registered")
    return Workload.model_validate(found.model_dump())


@router.post("/targets", status_code=status.HTTP_201_CREATED, summary="Register a target and get its fingerprint")
def create_target(spec: TargetSpec, session: SessionDep, who: SubmitKey) -> Target:
    # a write to the store like a workload's: submit scope, and a budget of its own per key (targets are few)
    enforce(target_bucket(), who.id, "target registrations")
    if problem := check_target(spec):
        unprocessable(["body", *problem.loc], problem.message)
    if spec.toolchain is None:
        unprocessable(["body", "toolchain"], "a target fingerprint needs the toolchain, e.g. {'tvm': '0.27.0.post1'}")
    if spec.is_host_alias:
        unprocessable(["body", "mcpu" if spec.mcpu else "arch"], "'host' is resolved on job submission only")
    return Target.model_validate(catalog.put_target(session, spec).model_dump())


@router.get("/targets/{fingerprint}", summary="Get a target by fingerprint")
def get_target(fingerprint: str, session: SessionDep, _: ReadKey) -> Target:
    found = catalog.get_target(session, fingerprint) or not_found(f"target {fingerprint} is not registered")
    return Target.model_validate(found.model_dump())


@router.get("/workers", summary="Workers seen by the store, newest first, with the hardware each tunes for")
def list_workers(session: SessionDep, _: ReadKey) -> list[WorkerInfo]:
    return [
        WorkerInfo(
            name=w.name,
            queues=w.queues,
            target=Target.model_validate({**w.target, "target_fingerprint": w.target_fingerprint}),
            started_at=w.started_at,
            last_seen=w.last_seen,
            online=catalog.is_online(w, get_settings().worker_stale_after_s),
        )
        for w in catalog.list_workers(session)
    ]


@router.get(
    "/targets",
    summary="Targets the live workers serve: copy one into a job, or submit with mcpu 'host'",
)
def list_served_targets(session: SessionDep, _: ReadKey) -> list[Target]:
    return [
        Target.model_validate({**t.model_dump(), "target_fingerprint": t.fingerprint})
        for t in catalog.served_targets(session, get_settings().worker_stale_after_s)
    ]
