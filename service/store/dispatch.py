"""Dispatch tables and the content-addressed artifacts they name.

A `ukernel` job publishes its artifacts and table in one transaction, so a table never names an
artifact the store lacks. Tables are appended, never replaced: lookups serve the newest for a
(workload, target fingerprint), and older ones stay for audit. Exact-shape configs from `sketch`
jobs are merged in at read time where they were measured faster than the table's program.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Table, func, select
from sqlalchemy.orm import Session

from service.models.artifact import Artifact
from service.models.shape import parse_shape_key
from service.store.db import dialect_insert
from service.store.tables import ArtifactRow, BestConfigRow, DispatchTableRow, utcnow


def put_artifact(session: Session, artifact: Artifact, target_fingerprint: str, job_id: str | None) -> None:
    """Store an artifact unless its content is already there (same sha256: same bytes; racing writers of
    the same bytes both succeed)."""
    table = cast(Table, ArtifactRow.__table__)
    stmt = dialect_insert(session)(table).values(
        sha256=artifact.sha256,
        target_fingerprint=target_fingerprint,
        kind="ukernel",
        spec=artifact.spec,
        size_bytes=len(artifact.data),
        data=artifact.data,
        job_id=job_id,
        created_at=utcnow(),
    )
    session.execute(stmt.on_conflict_do_nothing(index_elements=["sha256"]))


def get_artifact(session: Session, sha256: str) -> ArtifactRow | None:
    return session.get(ArtifactRow, sha256)


def publish(
    session: Session,
    *,
    workload_hash: str,
    target_fingerprint: str,
    dim: str,
    table: Mapping[str, Any],
    artifacts: Sequence[Artifact],
    predicted: Sequence[float],
    measured: Mapping[int, float],
    validation: Mapping[str, Any],
    job_id: str | None,
) -> DispatchTableRow:
    for artifact in artifacts:
        put_artifact(session, artifact, target_fingerprint, job_id)
    row = DispatchTableRow(
        workload_hash=workload_hash,
        target_fingerprint=target_fingerprint,
        dim=dim,
        s_max=len(predicted),
        table=dict(table),
        ukernels=[{"id": a.ukernel_id, "sha256": a.sha256} for a in artifacts],
        predicted=list(predicted),
        measured={str(s): t for s, t in measured.items()},
        validation=dict(validation),
        job_id=job_id,
    )
    session.add(row)
    session.flush()
    return row


def latest(session: Session, workload_hash: str, target_fingerprint: str) -> DispatchTableRow | None:
    """The table served for (workload, target): the newest one not rolled back."""
    return served_before(session, workload_hash, target_fingerprint, None)


def served_before(
    session: Session, workload_hash: str, target_fingerprint: str, before_id: int | None
) -> DispatchTableRow | None:
    """The newest table not rolled back for (workload, target), older than table `before_id` when given: what a
    rollback of that table serves instead."""
    stmt = select(DispatchTableRow).where(
        DispatchTableRow.workload_hash == workload_hash,
        DispatchTableRow.target_fingerprint == target_fingerprint,
        DispatchTableRow.retired_at.is_(None),
    )
    if before_id is not None:
        stmt = stmt.where(DispatchTableRow.id < before_id)
    return session.scalars(stmt.order_by(DispatchTableRow.id.desc()).limit(1)).first()


def retired_since(session: Session, workload_hash: str, target_fingerprint: str, since: dt.datetime) -> bool:
    """Whether a table for (workload, target) was rolled back at or after `since`."""
    stmt = select(DispatchTableRow.id).where(
        DispatchTableRow.workload_hash == workload_hash,
        DispatchTableRow.target_fingerprint == target_fingerprint,
        DispatchTableRow.retired_at >= since,
    )
    return session.scalars(stmt.limit(1)).first() is not None


def retire(session: Session, row: DispatchTableRow, reason: str) -> None:
    """Roll a table back: never served again (hosts get the one before it, or none), kept with why."""
    row.retired_at = utcnow()
    row.retired_reason = reason[:500]


def published_by(session: Session, job_id: str) -> DispatchTableRow | None:
    """The table a job published (a job publishes at most one)."""
    stmt = select(DispatchTableRow).where(DispatchTableRow.job_id == job_id).order_by(DispatchTableRow.id.desc())
    return session.scalars(stmt.limit(1)).first()


def latest_per_key(session: Session, workload_hash: str | None, fingerprint: str | None, limit: int) -> list[Any]:
    """(workload, target, id, dim, s_max, job_id, created_at) of the newest table per (workload, target)."""
    t = DispatchTableRow
    newest = select(func.max(t.id)).where(t.retired_at.is_(None)).group_by(t.workload_hash, t.target_fingerprint)
    q = select(t.workload_hash, t.target_fingerprint, t.id, t.dim, t.s_max, t.job_id, t.created_at).where(
        t.id.in_(newest)
    )
    if workload_hash:
        q = q.where(t.workload_hash == workload_hash)
    if fingerprint:
        q = q.where(t.target_fingerprint == fingerprint)
    return list(session.execute(q.order_by(t.workload_hash, t.target_fingerprint).limit(limit)))


def _table_latency(row: DispatchTableRow, S: int) -> float | None:
    if str(S) in row.measured:
        return float(row.measured[str(S)])
    return float(row.predicted[S - 1]) if 1 <= S <= len(row.predicted) else None


MAX_OVERRIDES = 64  # exact-shape configs carry their IR: bound what every table fetch ships


def override_keys(session: Session, row: DispatchTableRow) -> list[tuple[str, int, float, float | None]]:
    """(shape key, S, latency, table latency) of the exact-shape configs of this workload and target that are
    faster than the table's program at their S (or lie past its range), without loading the configs."""
    stmt = select(BestConfigRow.shape_key, BestConfigRow.latency_s).where(
        BestConfigRow.workload_hash == row.workload_hash,
        BestConfigRow.target_fingerprint == row.target_fingerprint,
    )
    out = []
    for key, latency in session.execute(stmt):
        shape = parse_shape_key(key)
        if set(shape) != {row.dim}:
            continue
        S = shape[row.dim]
        ours = _table_latency(row, S)
        if ours is None or latency < ours:
            out.append((key, S, float(latency), ours))
    return sorted(out, key=lambda o: o[1])[:MAX_OVERRIDES]


def etag(row: DispatchTableRow, overrides: Sequence[tuple[str, int, float, float | None]]) -> str:
    """Changes exactly when the document would: a new table, or a new or faster exact-shape config."""
    blob = f"{row.id}|" + "|".join(f"{k}:{lat!r}" for k, _, lat, _ in overrides)
    return '"' + hashlib.sha256(blob.encode()).hexdigest()[:32] + '"'


def override_configs(
    session: Session, row: DispatchTableRow, keys: Sequence[tuple[str, int, float, float | None]]
) -> dict[str, dict[str, Any]]:
    """Shape key → config of the exact-shape overrides `keys` names (one query, not one per override)."""
    if not keys:
        return {}
    stmt = select(BestConfigRow.shape_key, BestConfigRow.config).where(
        BestConfigRow.workload_hash == row.workload_hash,
        BestConfigRow.target_fingerprint == row.target_fingerprint,
        BestConfigRow.shape_key.in_([k for k, _, _, _ in keys]),
    )
    # (dict() would take the Result for a mapping: it has .keys())
    return {key: config for key, config in session.execute(stmt)}


def table_artifacts(session: Session, row: DispatchTableRow) -> dict[str, ArtifactRow]:
    """sha256 → the stored artifact of each uKernel the table names (published tables only name stored ones)."""
    shas = [u["sha256"] for u in row.ukernels]
    return {a.sha256: a for a in session.scalars(select(ArtifactRow).where(ArtifactRow.sha256.in_(shas)))}
