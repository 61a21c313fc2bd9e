"""Best configs per (workload hash, target fingerprint, shape) and every measured candidate."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import cast

from sqlalchemy import Connection, Table, bindparam, func, select
from sqlalchemy.orm import Session

from service.models import ConfigRecord, shape_key
from service.models.config import CandidateStatus, MeasuredCandidate
from service.store.db import dialect_insert
from service.store.tables import BestConfigRow, CandidateRow, utcnow


def record_candidates(
    session: Session,
    job_id: str,
    workload_hash: str,
    fingerprint: str,
    shape: Mapping[str, int] | str,
    candidates: Iterable[MeasuredCandidate],
) -> None:
    """`shape` is a concrete shape, or the key of the unit the candidates were measured for (e.g. M=1..128)."""
    key = shape if isinstance(shape, str) else shape_key(shape)
    session.add_all(
        CandidateRow(
            job_id=job_id,
            workload_hash=workload_hash,
            target_fingerprint=fingerprint,
            shape_key=key,
            config=c.config,
            latency_s=c.latency_s,
            status=c.status,
            error=c.error,
        )
        for c in candidates
    )


def job_candidates(session: Session, job_id: str, fingerprint: str, key: str) -> list[MeasuredCandidate]:
    """The candidates a job recorded for one shape or unit key on one target, oldest first."""
    rows = session.scalars(
        select(CandidateRow)
        .where(
            CandidateRow.job_id == job_id,
            CandidateRow.target_fingerprint == fingerprint,
            CandidateRow.shape_key == key,
        )
        .order_by(CandidateRow.id)
    )
    return [_measured(r) for r in rows]


def _measured(row: CandidateRow) -> MeasuredCandidate:
    return MeasuredCandidate(
        config=row.config, latency_s=row.latency_s, status=cast(CandidateStatus, row.status), error=row.error
    )


def target_candidates(session: Session, fingerprint: str, config_format: str, limit: int) -> list[MeasuredCandidate]:
    """Successful candidates any job recorded on one target in configs of one format, newest first."""
    rows = session.scalars(
        select(CandidateRow)
        .where(CandidateRow.target_fingerprint == fingerprint, CandidateRow.status == "ok")
        .order_by(CandidateRow.id.desc())
        .limit(limit)
    )
    return [_measured(r) for r in rows if isinstance(r.config, dict) and r.config.get("format") == config_format]


def upsert_best(session: Session, record: ConfigRecord) -> bool:
    """Atomically store `record` unless an equal or faster one is already there.

    One statement (INSERT … ON CONFLICT DO UPDATE … WHERE stored latency > new latency), so concurrent
    writers on PostgreSQL or SQLite can only ever leave the fastest config. Returns whether it won.
    """
    table = cast(Table, BestConfigRow.__table__)
    now = utcnow()
    values = {
        "workload_hash": record.workload_hash,
        "target_fingerprint": record.target_fingerprint,
        "shape_key": shape_key(record.shape),
        "shape": dict(record.shape),
        "latency_s": record.latency_s,
        "kind": record.kind,
        "config": record.config,
        "provenance": record.provenance,
        "job_id": record.job_id,
        "created_at": now,
        "updated_at": now,
    }
    stmt = dialect_insert(session)(table).values(**values)
    stmt = stmt.on_conflict_do_update(
        index_elements=["workload_hash", "target_fingerprint", "shape_key"],
        set_={
            k: stmt.excluded[k] for k in ("shape", "latency_s", "kind", "config", "provenance", "job_id", "updated_at")
        },
        where=table.c.latency_s > stmt.excluded.latency_s,
    )
    # RETURNING yields a row only when the insert or the update happened (rowcount is unreliable here)
    return session.execute(stmt.returning(table.c.latency_s)).first() is not None


def _to_record(row: BestConfigRow) -> ConfigRecord:
    return ConfigRecord(
        workload_hash=row.workload_hash,
        target_fingerprint=row.target_fingerprint,
        shape=row.shape,
        latency_s=row.latency_s,
        kind=row.kind,
        config=row.config,
        provenance=row.provenance,
        job_id=row.job_id,
        updated_at=row.updated_at,
    )


_BEST = cast(Table, BestConfigRow.__table__)
# The lookup inference hosts make, as one Core statement (compiled once, cached by SQLAlchemy): no ORM identity
# map or row objects on the hot path.
_BEST_BY_KEY = select(*(_BEST.c[name] for name in ConfigRecord.model_fields if name in _BEST.c)).where(
    _BEST.c.workload_hash == bindparam("workload"),
    _BEST.c.target_fingerprint == bindparam("target"),
    _BEST.c.shape_key == bindparam("shape"),
)


def get_best(
    conn: Connection | Session, workload_hash: str, fingerprint: str, shape: Mapping[str, int]
) -> ConfigRecord | None:
    params = {"workload": workload_hash, "target": fingerprint, "shape": shape_key(shape)}
    row = conn.execute(_BEST_BY_KEY, params).mappings().first()
    return None if row is None else ConfigRecord(**row)


def list_best(
    session: Session, workload_hash: str | None = None, fingerprint: str | None = None, limit: int = 1000
) -> list[ConfigRecord]:
    q = select(BestConfigRow)
    if workload_hash:
        q = q.where(BestConfigRow.workload_hash == workload_hash)
    if fingerprint:
        q = q.where(BestConfigRow.target_fingerprint == fingerprint)
    q = q.order_by(BestConfigRow.workload_hash, BestConfigRow.target_fingerprint, *_SHAPES_NUMERICALLY)
    records = [_to_record(r) for r in session.scalars(q.limit(limit))]
    return sorted(records, key=lambda r: (r.workload_hash, r.target_fingerprint, shape_order(r.shape)))


def published_by(session: Session, job_id: str, limit: int = 1000) -> list[ConfigRecord]:
    """The best configs a job published (and that no later job beat)."""
    q = select(BestConfigRow).where(BestConfigRow.job_id == job_id).order_by(*_SHAPES_NUMERICALLY)
    return sorted((_to_record(r) for r in session.scalars(q.limit(limit))), key=lambda r: shape_order(r.shape))


def shape_order(shape: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """Sorts shapes by their sizes as numbers (M=2 before M=10), dim by dim in `shape_key`'s order of names."""
    return tuple((name, int(shape[name])) for name in sorted(shape))


# The same order in SQL, so a `limit` keeps the smallest shapes: a shorter key of the same dims has the smaller
# number (M=9 before M=10), and keys of one length compare digit by digit. Exact for one dim; with several, the
# rows are re-sorted by `shape_order` after loading.
_SHAPES_NUMERICALLY = (func.length(BestConfigRow.shape_key), BestConfigRow.shape_key)
