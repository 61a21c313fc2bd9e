"""Registered workloads, targets and workers."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Target, TargetSpec, Workload, WorkloadSpec
from service.store.tables import TargetRow, WorkerRow, WorkloadRow, utcnow


def put_workload(session: Session, spec: WorkloadSpec) -> Workload:
    """Idempotent: the same spec always maps to the same hash and row."""
    h = spec.hash
    if session.get(WorkloadRow, h) is None:
        session.add(WorkloadRow(workload_hash=h, op=spec.op, spec=spec.canonical()))
        session.flush()
    return Workload(**spec.canonical(), workload_hash=h)


def get_workload(session: Session, workload_hash: str) -> Workload | None:
    row = session.get(WorkloadRow, workload_hash)
    return None if row is None else Workload(**row.spec, workload_hash=row.workload_hash)


def list_workloads(session: Session, limit: int = 100, offset: int = 0) -> list[Workload]:
    rows = session.scalars(select(WorkloadRow).order_by(WorkloadRow.created_at).limit(limit).offset(offset))
    return [Workload(**r.spec, workload_hash=r.workload_hash) for r in rows]


def put_target(session: Session, spec: TargetSpec) -> Target:
    fp = spec.fingerprint
    if session.get(TargetRow, fp) is None:
        session.add(TargetRow(target_fingerprint=fp, spec=spec.model_dump()))
        session.flush()
    return Target(**spec.model_dump(), target_fingerprint=fp)


def get_target(session: Session, fingerprint: str) -> Target | None:
    row = session.get(TargetRow, fingerprint)
    return None if row is None else Target(**row.spec, target_fingerprint=row.target_fingerprint)


def announce_worker(session: Session, name: str, queues: list[str], target: TargetSpec) -> None:
    row = session.get(WorkerRow, name)
    now = utcnow()
    if row is None:
        session.add(
            WorkerRow(name=name, queues=queues, target=target.model_dump(), target_fingerprint=target.fingerprint)
        )
    else:
        row.queues, row.target, row.target_fingerprint = queues, target.model_dump(), target.fingerprint
        row.started_at = row.last_seen = now
    put_target(session, target)


def list_workers(session: Session) -> list[WorkerRow]:
    return list(session.scalars(select(WorkerRow).order_by(WorkerRow.last_seen.desc())))
