"""Models: one row per onboarded model, one per op, linking the model to its workloads and jobs."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kernelfleet.models import ModelOpView, ModelView
from service.models import JobState
from service.store.tables import JobRow, ModelOpRow, ModelRow, WorkloadRow, utcnow


def create_model(
    session: Session,
    *,
    name: str,
    kind: str,
    target: dict[str, Any],
    budget: dict[str, Any],
    split: dict[str, Any],
    tags: dict[str, str],
    owner_key_id: str | None,
    ops: Sequence[dict[str, Any]],
) -> ModelRow:
    """The model and its op rows (each op dict holds ModelOpRow's fields but `model_id` and `idx`)."""
    row = ModelRow(
        id=str(uuid.uuid4()),
        name=name,
        kind=kind,
        target=target,
        budget=budget,
        split=split,
        tags=tags,
        owner_key_id=owner_key_id,
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    session.add_all([ModelOpRow(model_id=row.id, idx=i, **op) for i, op in enumerate(ops)])
    session.flush()
    return row


def get_row(session: Session, model_id: str) -> ModelRow | None:
    return session.get(ModelRow, model_id)


def op_rows(session: Session, model_id: str) -> list[ModelOpRow]:
    return list(session.scalars(select(ModelOpRow).where(ModelOpRow.model_id == model_id).order_by(ModelOpRow.idx)))


def job_ids(session: Session, model_id: str) -> list[str]:
    q = select(ModelOpRow.job_id).where(ModelOpRow.model_id == model_id, ModelOpRow.job_id.is_not(None))
    return [j for j in session.scalars(q.order_by(ModelOpRow.idx)) if j]


def list_rows(session: Session, name: str | None, limit: int, offset: int) -> tuple[list[ModelRow], int]:
    q = select(ModelRow)
    if name:
        q = q.where(ModelRow.name == name)
    total = session.scalar(select(func.count()).select_from(q.subquery())) or 0
    return list(session.scalars(q.order_by(ModelRow.created_at.desc()).limit(limit).offset(offset))), total


def aggregate_state(states: Sequence[str]) -> str:
    """One state for a model's jobs: queued until one starts, running until all end, then succeeded only when
    all succeeded, else failed when any failed, else cancelled."""
    if not states:
        return JobState.succeeded.value
    if all(JobState(s).terminal for s in states):
        for final in (JobState.failed, JobState.cancelled):
            if final.value in states:
                return final.value
        return JobState.succeeded.value
    if all(s == JobState.queued.value for s in states):
        return JobState.queued.value
    return JobState.running.value


def view(session: Session, row: ModelRow) -> ModelView:
    """The model with its ops' jobs: states, done/total, trials, and each op's job id and progress."""
    ops = op_rows(session, row.id)
    ids = [o.job_id for o in ops if o.job_id]
    job_rows = {j.id: j for j in session.scalars(select(JobRow).where(JobRow.id.in_(ids)))} if ids else {}
    hashes = {o.workload_hash for o in ops}
    names = session.execute(
        select(WorkloadRow.workload_hash, WorkloadRow.op).where(WorkloadRow.workload_hash.in_(hashes))
    )
    op_names = {h: op for h, op in names}
    shares = row.split.get("ops", [])
    views, states, done, total = [], [], 0, 0
    for o in ops:
        job = job_rows.get(o.job_id) if o.job_id else None
        share = next((s.get("share", 0.0) for s in shares if s.get("name") == o.name), 0.0)
        op_view = ModelOpView(
            name=o.name,
            op=op_names.get(o.workload_hash, "?"),
            workload_hash=o.workload_hash,
            occurrences=o.occurrences,
            dims=o.dims,
            priority=o.priority,
            share=share,
            trials=o.trials,
            skipped=o.skipped,
            job_id=o.job_id,
        )
        if job is not None:
            succeeded = job.state == JobState.succeeded.value
            op_view.state = job.state
            op_view.trials_done, op_view.trials_total = job.trials_done, job.trials_total
            op_view.progress = 1.0 if succeeded else min(1.0, job.trials_done / max(job.trials_total, 1))
            op_view.error = job.error
            states.append(job.state)
            # a finished job counts as all its planned trials (a sketch search can stop early)
            done += job.trials_total if succeeded else min(job.trials_done, job.trials_total)
            total += job.trials_total
        views.append(op_view)
    state = aggregate_state(states)
    return ModelView(
        id=row.id,
        name=row.name,
        kind=row.kind,
        target=row.target,
        state=state,
        progress=1.0 if state == JobState.succeeded.value else (done / total if total else 0.0),
        jobs_total=len(states),
        jobs_done=sum(JobState(s).terminal for s in states),
        states=dict(Counter(states)),
        trials_done=done,
        trials_total=total,
        budget=row.budget,
        budget_split=row.split,
        tags=row.tags,
        ops=views,
        created_at=row.created_at,
    )
