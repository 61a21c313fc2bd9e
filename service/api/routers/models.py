"""Models: onboard a model's operators in one request (one job per tunable op), its progress, cancel.

The model was parsed on the client (`kernelfleet.model_import`); the request carries the extracted operators,
never the model. Each op is validated as a job of the model's kind on its target would be: a workload or
distribution the service refuses is a 422 at `ops.<i>.…`, an attribute the kind cannot do there (e.g. an
activation CUDA uKernels do not fuse) a 422 at `ops.<i>.workload.attrs…`, while an op the kind cannot tune at all
on that target (a float16 conv2d for `ukernel`) is listed as skipped in the response, not dropped.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Response, status
from sqlalchemy.orm import Session

from kernelfleet.models import ModelList, ModelView
from service.api.auth import ReadKey, SubmitKey
from service.api.deps import SessionDep, unprocessable
from service.api.documents import model_view
from service.api.limits import enforce
from service.api.lookup import AMBIGUOUS_PREFIX, ID_RULE, ReadableModel, find
from service.api.routers.jobs import cancel as cancel_job
from service.api.state import submit_bucket
from service.models import Budget, JobSpec, JobState, WorkloadSpec
from service.models.auth import ApiKeyView, Scope
from service.models.model import ModelOp, ModelSpec, op_priority, split_budget
from service.settings import get_settings
from service.store import catalog, jobs
from service.store import models as store
from service.store.tables import ModelRow
from service.tuning.admission import check_job, check_kind, check_target
from service.workers.submission import create, enqueue_jobs

router = APIRouter(prefix="/v1/models", tags=["models"])

SPLIT_RULE = (
    "each tunable op's job gets budget.min_trials, and the rest of budget.trials is split in proportion to the op's "
    "priority = expected FLOPs per call over its distribution (weights normalised) × occurrences"
)


def _skip_reason(spec: ModelSpec, op: ModelOp, budget: Budget) -> str | None:
    """Why the model's kind cannot tune this op on the target at all (with its operator's default attributes),
    or None; a problem elsewhere than the workload is the request's (a 422), not a reason to skip."""
    probe = WorkloadSpec.model_validate({**op.workload.model_dump(), "attrs": {}})
    problem = check_job(spec.kind, probe, op.distribution, spec.target, budget, spec.tags)
    if problem is not None and problem.loc[:1] == ("workload",):
        return f"{spec.kind} jobs cannot tune this op on {spec.target.kind}: {problem.message}"
    return None


def _loc(i: int, loc: tuple[str | int, ...]) -> list[str | int]:
    """Where a job-level problem of op i is in the model request: the target, tags and budget are the model's."""
    if loc[:1] in (("target",), ("kind",), ("tags",)):
        return ["body", *loc]
    if loc[:1] == ("budget",):
        return ["body", "budget", "min_trials" if loc[1:] == ("trials",) else loc[-1]]
    return ["body", "ops", i, *loc]


@router.post("", status_code=status.HTTP_202_ACCEPTED, summary="Onboard a model: one job per tunable op")
def add_model(spec: ModelSpec, session: SessionDep, response: Response, who: SubmitKey) -> ModelView:
    enforce(submit_bucket(), who.id, "submissions")
    if problem := check_kind(spec.kind):
        unprocessable(["body", *problem.loc], problem.message)
    if problem := check_target(spec.target):
        unprocessable(["body", "target", *problem.loc], problem.message)
    if spec.target.is_host_alias:
        resolved = catalog.resolve_host_alias(session, spec.target, get_settings().worker_stale_after_s)
        if isinstance(resolved, str):
            unprocessable(["body", "target"], resolved)
        spec = spec.model_copy(update={"target": resolved})
    floor = Budget(trials=spec.budget.min_trials, max_shapes=spec.budget.max_shapes, seed=spec.budget.seed)

    skipped: dict[int, str] = {}
    priorities: dict[int, float] = {}
    for i, op in enumerate(spec.ops):
        if reason := _skip_reason(spec, op, floor):
            skipped[i] = reason
        elif problem := check_job(spec.kind, op.workload, op.distribution, spec.target, floor, spec.tags):
            unprocessable(_loc(i, problem.loc), problem.message)
        try:
            priorities[i] = op_priority(op)
        except ValueError as exc:
            unprocessable(["body", "ops", i, "distribution"], str(exc))
    tunable = [i for i in range(len(spec.ops)) if i not in skipped]
    if not tunable:
        reasons = "; ".join(f"ops.{i}: {r}" for i, r in skipped.items())
        unprocessable(["body", "ops"], f"no op of this model can be tuned by {spec.kind} jobs: {reasons}")
    needed = spec.budget.min_trials * len(tunable)
    if spec.budget.trials < needed:
        unprocessable(
            ["body", "budget", "trials"],
            f"{spec.budget.trials} trials cannot give {len(tunable)} tunable ops {spec.budget.min_trials} each "
            f"(budget.min_trials): give at least {needed}, or lower min_trials",
        )
    trials = dict(
        zip(tunable, split_budget([priorities[i] for i in tunable], spec.budget.trials, floor.trials), strict=True)
    )
    weight = sum(priorities[i] for i in tunable) or 1.0
    split: dict[str, Any] = {
        "rule": SPLIT_RULE,
        "total_trials": spec.budget.trials,
        "min_trials": spec.budget.min_trials,
        "ops": [
            {
                "name": op.name,
                "priority": priorities[i],
                "share": priorities[i] / weight if i in trials else 0.0,
                "trials": trials.get(i, 0),
                **({"skipped": skipped[i]} if i in skipped else {}),
            }
            for i, op in enumerate(spec.ops)
        ],
    }

    rows, op_rows = [], []
    for i, op in enumerate(spec.ops):
        workload = catalog.put_workload(session, op.workload)
        job_id = None
        if i in trials:
            budget = Budget(trials=trials[i], max_shapes=spec.budget.max_shapes, seed=spec.budget.seed)
            tags = {**spec.tags, "model": spec.name, "model_op": op.name[:100]}
            job = JobSpec(
                kind=spec.kind,
                workload=workload.workload_hash,
                target=spec.target,
                distribution=op.distribution,
                budget=budget,
                tags=dict(list(tags.items())[-16:]),
            )
            row = create(session, job, workload.workload_hash, owner_key_id=who.id)
            rows.append(row)
            job_id = row.id
        op_rows.append(
            {
                "name": op.name,
                "workload_hash": workload.workload_hash,
                "job_id": job_id,
                "occurrences": op.occurrences,
                "distribution": op.distribution.model_dump(),
                "dims": op.dims,
                "sources": op.sources,
                "priority": priorities[i],
                "trials": trials.get(i, 0),
                "skipped": skipped.get(i),
            }
        )
    model = store.create_model(
        session,
        name=spec.name,
        kind=spec.kind,
        target=spec.target.model_dump(),
        budget=spec.budget.model_dump(),
        split=split,
        tags=spec.tags,
        owner_key_id=who.id,
        ops=op_rows,
    )
    session.commit()  # the model, its ops and every job are durable together before any message is sent
    enqueue_jobs(session, rows)
    response.headers["Location"] = f"/v1/models/{model.id}"
    return model_view(session, model)


@router.get("", summary="List models, newest first")
def list_models(
    session: SessionDep,
    _: ReadKey,
    name: str | None = Query(None, max_length=100),
    limit: int = Query(50, ge=1, le=500),
    offset: int = Query(0, ge=0, le=1_000_000),
) -> ModelList:
    rows, total = store.list_rows(session, name, limit, offset)
    return ModelList(models=[model_view(session, r) for r in rows], total=total)


@router.get(
    "/{model_id}",
    summary="A model's progress over its jobs: states, done/total, per-op job ids",
    description=ID_RULE,
    responses=AMBIGUOUS_PREFIX,
)
def get_model(row: ReadableModel, session: SessionDep) -> ModelView:
    return model_view(session, row)


@router.post(
    "/{model_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Cancel every unfinished job",
    responses=AMBIGUOUS_PREFIX,
)
def cancel_model(model_id: str, session: SessionDep, who: SubmitKey) -> ModelView:
    return model_view(session, cancel(session, model_id, who))


def cancel(session: Session, model_id: str, who: ApiKeyView) -> ModelRow:
    """Cancel as `who` (the key that added the model, or an admin key) every job of the model not yet ended.
    `model_id` may be a unique prefix."""
    row = store.get_row(session, find(session, ModelRow, model_id, who))
    assert row is not None  # just resolved in this transaction
    if row.owner_key_id != who.id and Scope.admin not in who.scopes:
        raise HTTPException(403, "only the key that added a model, or an admin key, can cancel it")
    for job_id in store.job_ids(session, row.id):
        job = jobs.get_row(session, job_id)
        if job is not None and not JobState(job.state).terminal:
            cancel_job(session, job_id, who)  # the jobs' own cancel path: queued at once, running at a heartbeat
    return row
