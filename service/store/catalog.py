"""Registered workloads, targets and workers."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models import Target, TargetSpec, Workload, WorkloadSpec
from service.models.target import HOST_ALIAS
from service.store.db import dialect_insert
from service.store.tables import ModelOpRow, ModelRow, TargetRow, WorkerRow, WorkloadRow, utcnow


def put_workload(session: Session, spec: WorkloadSpec) -> Workload:
    """Idempotent: the same spec always maps to the same hash and row."""
    h = spec.hash
    if session.get(WorkloadRow, h) is None:
        _insert_once(session, WorkloadRow, workload_hash=h, op=spec.op, spec=spec.canonical())
    return Workload(**spec.canonical(), workload_hash=h)


def _insert_once(session: Session, row: type[WorkloadRow] | type[TargetRow], **values: Any) -> None:
    """Insert a content-addressed row unless it is there: two requests registering the same spec at once (a client
    retrying a POST that timed out while the first still runs) both succeed, and the row is the same either way."""
    stmt = dialect_insert(session)(row.__table__).values(created_at=utcnow(), **values)
    session.execute(stmt.on_conflict_do_nothing())


def get_workload(session: Session, workload_hash: str) -> Workload | None:
    row = session.get(WorkloadRow, workload_hash)
    return None if row is None else Workload(**row.spec, workload_hash=row.workload_hash)


def workload_label(session: Session, workload_hash: str) -> str:
    """The workload as people read it, with the onboarded models that run it and how often a forward calls it:
    'dense M=? N=3072 K=768 +bias +gelu (bert-base 12×, gpt2 12×)'; "" when it is not registered here. Two layers
    of one shape are one workload (one table serves both): the models say which layers a line stands for."""
    workload = get_workload(session, workload_hash)
    if workload is None:
        return ""
    uses = model_uses(session, workload_hash)
    models = ", ".join(f"{name} {calls}×" for name, calls in uses.items())
    return f"{workload.label()} ({models})" if models else workload.label()


def model_uses(session: Session, workload_hash: str) -> dict[str, int]:
    """Model name → the workload's calls per forward of that model (its ops' occurrences added; a model onboarded
    more than once counts once, at its largest), by name."""
    per_model = select(ModelRow.name, ModelRow.id, func.sum(ModelOpRow.occurrences)).join(
        ModelOpRow, ModelOpRow.model_id == ModelRow.id
    )
    rows = session.execute(
        per_model.where(ModelOpRow.workload_hash == workload_hash).group_by(ModelRow.name, ModelRow.id)
    )
    uses: dict[str, int] = {}
    for name, _, calls in rows:
        uses[name] = max(uses.get(name, 0), int(calls or 0))
    return dict(sorted(uses.items()))


def list_workloads(session: Session, limit: int = 100, offset: int = 0) -> list[Workload]:
    rows = session.scalars(select(WorkloadRow).order_by(WorkloadRow.created_at).limit(limit).offset(offset))
    return [Workload(**r.spec, workload_hash=r.workload_hash) for r in rows]


def put_target(session: Session, spec: TargetSpec) -> Target:
    fp = spec.fingerprint
    if session.get(TargetRow, fp) is None:
        _insert_once(session, TargetRow, target_fingerprint=fp, spec=spec.model_dump())
    return Target(**spec.model_dump(), target_fingerprint=fp)


def get_target(session: Session, fingerprint: str) -> Target | None:
    row = session.get(TargetRow, fingerprint)
    return None if row is None else Target(**row.spec, target_fingerprint=row.target_fingerprint)


def list_targets(session: Session, limit: int = 200) -> list[Target]:
    rows = session.scalars(select(TargetRow).order_by(TargetRow.created_at).limit(limit))
    return [Target(**r.spec, target_fingerprint=r.target_fingerprint) for r in rows]


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


def touch_worker(session: Session, name: str) -> bool:
    """A worker's heartbeat: keep its `last_seen` current. False when the worker never announced itself."""
    row = session.get(WorkerRow, name)
    if row is None:
        return False
    row.last_seen = utcnow()
    return True


def list_workers(session: Session) -> list[WorkerRow]:
    return list(session.scalars(select(WorkerRow).order_by(WorkerRow.last_seen.desc())))


def is_online(worker: WorkerRow, stale_after_s: float, now: dt.datetime | None = None) -> bool:
    """A worker is live while its heartbeats keep `last_seen` within `stale_after_s`."""
    return (now or utcnow()) - worker.last_seen <= dt.timedelta(seconds=stale_after_s)


def live_workers(session: Session, stale_after_s: float) -> list[WorkerRow]:
    since = utcnow() - dt.timedelta(seconds=stale_after_s)
    return list(
        session.scalars(select(WorkerRow).where(WorkerRow.last_seen >= since).order_by(WorkerRow.last_seen.desc()))
    )


def live_queues(session: Session, stale_after_s: float) -> set[str]:
    """Queues some live worker consumes: a job on any other queue waits for a worker that is not there."""
    return {q for w in live_workers(session, stale_after_s) for q in w.queues}


def resolve_host_alias(session: Session, spec: TargetSpec, stale_after_s: float) -> TargetSpec | str:
    """The one target live workers serve for an aliased spec (`mcpu: host`), or why there is not exactly one."""
    served = [t for t in served_targets(session, stale_after_s) if t.kind == spec.kind]
    if len(served) == 1:
        return served[0]
    if not served:
        return (
            f"no live worker serves a {spec.kind} target, so '{HOST_ALIAS}' names nothing: start a worker "
            "(`kernelfleet worker`) or give the target in full"
        )
    choices = "; ".join(
        json.dumps(t.model_dump(exclude={"toolchain", "details"}, exclude_defaults=True)) for t in served
    )
    return f"live workers serve several {spec.kind} targets, so '{HOST_ALIAS}' is ambiguous; pick one of: {choices}"


def served_targets(session: Session, stale_after_s: float) -> list[TargetSpec]:
    """The distinct targets live workers tune for, newest worker first (what `mcpu: host` resolves to)."""
    seen: dict[str, TargetSpec] = {}
    for w in live_workers(session, stale_after_s):
        seen.setdefault(w.target_fingerprint, TargetSpec.model_validate(w.target))
    return list(seen.values())
