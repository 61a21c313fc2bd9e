"""Models: one row per onboarded model, one per op, linking the model to its workloads and jobs."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

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


def op_jobs(session: Session, ops: Sequence[ModelOpRow]) -> dict[str, JobRow]:
    """The jobs of a model's ops, by id."""
    ids = [o.job_id for o in ops if o.job_id]
    return {j.id: j for j in session.scalars(select(JobRow).where(JobRow.id.in_(ids)))} if ids else {}


def op_names(session: Session, ops: Sequence[ModelOpRow]) -> dict[str, str]:
    """Workload hash → its operator ('dense', 'conv2d', ...) for a model's ops."""
    hashes = {o.workload_hash for o in ops}
    query = select(WorkloadRow.workload_hash, WorkloadRow.op).where(WorkloadRow.workload_hash.in_(hashes))
    return {h: op for h, op in session.execute(query)}
