"""Fleet telemetry (idempotent batches summed per day), usage queries, and daily-run bookkeeping."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, func, select
from sqlalchemy.orm import Session

from service.models import shape_key
from service.models.fleet import FleetReport, TelemetryBatch
from service.store.db import dialect_insert
from service.store.tables import FleetRunRow, HoldoutDayRow, TelemetryBatchRow, UsageDayRow, utcnow


def ingest(session: Session, batch: TelemetryBatch, key_id: str | None, today: dt.date) -> bool:
    """Add a batch to the daily sums; False (and no change) when this batch id was counted before.

    The batch id row and the sums are written in one transaction, and the id is claimed with
    INSERT … ON CONFLICT DO NOTHING, so a batch resent concurrently is still counted once.
    """
    batches = cast(Table, TelemetryBatchRow.__table__)
    claim = (
        dialect_insert(session)(batches)
        .values(
            batch_id=str(batch.batch_id),
            key_id=key_id,
            host=batch.host,
            records=len(batch.records),
            received_at=utcnow(),
        )
        .on_conflict_do_nothing(index_elements=["batch_id"])
        .returning(batches.c.batch_id)
    )
    if session.execute(claim).first() is None:
        return False
    sums: dict[tuple[dt.date, str, str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0])
    for r in batch.records:
        acc = sums[(r.day or today, r.workload_hash, r.target_fingerprint, shape_key(r.shape))]
        acc[0] += r.calls
        acc[1] += r.kernel_seconds
        acc[2] += r.fallbacks
    usage = cast(Table, UsageDayRow.__table__)
    for (day, wh, fp, key), (calls, seconds, fallbacks) in sorted(sums.items()):
        stmt = dialect_insert(session)(usage).values(
            day=day,
            workload_hash=wh,
            target_fingerprint=fp,
            shape_key=key,
            calls=int(calls),
            kernel_seconds=seconds,
            fallbacks=int(fallbacks),
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=["day", "workload_hash", "target_fingerprint", "shape_key"],
            set_={
                "calls": usage.c.calls + stmt.excluded.calls,
                "kernel_seconds": usage.c.kernel_seconds + stmt.excluded.kernel_seconds,
                "fallbacks": usage.c.fallbacks + stmt.excluded.fallbacks,
            },
        )
        session.execute(stmt)
    _ingest_holdout(session, batch, today)
    return True


def _ingest_holdout(session: Session, batch: TelemetryBatch, today: dt.date) -> None:
    """Add the batch's A/B holdout sums per (day, workload, target, table, shape, baseline)."""
    sums: dict[tuple[dt.date, str, str, str, str, str], list[float]] = defaultdict(
        lambda: [0.0] * len(HOLDOUT_SUMS)
    )
    for r in batch.records:
        if r.holdout is None:
            continue
        day, job = r.day or today, r.table_job_id or ""
        acc = sums[(day, r.workload_hash, r.target_fingerprint, job, shape_key(r.shape), r.holdout.baseline)]
        for i, name in enumerate(HOLDOUT_SUMS):
            acc[i] += getattr(r.holdout, name)
    table = cast(Table, HoldoutDayRow.__table__)
    keys = ["day", *_HOLDOUT_KEYS]
    for key, values in sorted(sums.items()):
        stmt = dialect_insert(session)(table).values(**dict(zip(keys, key, strict=True)), **_typed_sums(values))
        stmt = stmt.on_conflict_do_update(
            index_elements=keys, set_={name: table.c[name] + stmt.excluded[name] for name in HOLDOUT_SUMS}
        )
        session.execute(stmt)


@dataclass(frozen=True)
class HoldoutSums:
    """One (workload, target, table, shape, baseline)'s A/B sums over some days (service.workers.fleet.savings
    reads them)."""

    workload_hash: str
    target_fingerprint: str
    table_job_id: str
    shape_key: str
    baseline: str
    served_calls: int
    served_s: float
    served_s2: float
    baseline_calls: int
    baseline_s: float
    baseline_s2: float


_HOLDOUT_KEYS = ("workload_hash", "target_fingerprint", "table_job_id", "shape_key", "baseline")
HOLDOUT_SUMS = tuple(f.name for f in dataclasses.fields(HoldoutSums) if f.name not in _HOLDOUT_KEYS)


def _typed_sums(values: Iterable[Any]) -> dict[str, Any]:
    """The six sums by name, counts as integers (a SUM over no rows is NULL: 0)."""
    return {
        name: int(v or 0) if name.endswith("calls") else float(v or 0.0)
        for name, v in zip(HOLDOUT_SUMS, values, strict=True)
    }


def holdout(
    session: Session,
    since: dt.date,
    until: dt.date,
    *,
    workload_hash: str | None = None,
    target_fingerprint: str | None = None,
    table_job_id: str | None = None,
    by_table: bool = False,
) -> list[HoldoutSums]:
    """A/B sums for days in [since, until] per (workload, target, shape, baseline), and per table too when
    `by_table` (else every table's sums together, table_job_id "")."""
    h = HoldoutDayRow
    keys = [h.workload_hash, h.target_fingerprint, h.shape_key, h.baseline] + ([h.table_job_id] if by_table else [])
    q = select(*keys, *(func.sum(h.__table__.c[name]) for name in HOLDOUT_SUMS)).where(h.day >= since, h.day <= until)
    if workload_hash:
        q = q.where(h.workload_hash == workload_hash)
    if target_fingerprint:
        q = q.where(h.target_fingerprint == target_fingerprint)
    if table_job_id is not None:
        q = q.where(h.table_job_id == table_job_id)
    return [
        HoldoutSums(
            workload_hash=row[0],
            target_fingerprint=row[1],
            shape_key=row[2],
            baseline=row[3],
            table_job_id=row[4] if by_table else "",
            **_typed_sums(row[len(keys) :]),
        )
        for row in session.execute(q.group_by(*keys).order_by(*keys))
    ]


def host_baselines(session: Session, since: dt.date, until: dt.date) -> dict[tuple[str, str], dict[str, int]]:
    """(workload, target) → {baseline: calls the hosts held out for it} over days in [since, until]: what the
    hosts of each layer run without KernelFleet ("" for sums recorded before baselines were)."""
    h = HoldoutDayRow
    q = (
        select(h.workload_hash, h.target_fingerprint, h.baseline, func.sum(h.baseline_calls))
        .where(h.day >= since, h.day <= until)
        .group_by(h.workload_hash, h.target_fingerprint, h.baseline)
    )
    out: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for wh, fp, baseline, calls in session.execute(q):
        out[(wh, fp)][baseline] = int(calls or 0)
    return dict(out)


@dataclass(frozen=True)
class Usage:
    workload_hash: str
    target_fingerprint: str
    shape_key: str
    calls: int
    kernel_seconds: float
    fallbacks: int


def usage(
    session: Session,
    since: dt.date,
    until: dt.date,
    workload_hash: str | None = None,
    target_fingerprint: str | None = None,
    limit: int = 10_000,
) -> list[Usage]:
    """Summed usage per (workload, target, shape) for days in [since, until], most time first."""
    u = UsageDayRow
    q = (
        select(
            u.workload_hash,
            u.target_fingerprint,
            u.shape_key,
            func.sum(u.calls),
            func.sum(u.kernel_seconds),
            func.sum(u.fallbacks),
        )
        .where(u.day >= since, u.day <= until)
        .group_by(u.workload_hash, u.target_fingerprint, u.shape_key)
        .order_by(func.sum(u.kernel_seconds).desc(), u.workload_hash, u.target_fingerprint, u.shape_key)
        .limit(limit)
    )
    if workload_hash:
        q = q.where(u.workload_hash == workload_hash)
    if target_fingerprint:
        q = q.where(u.target_fingerprint == target_fingerprint)
    return [
        Usage(wh, fp, key, int(c or 0), float(s or 0.0), int(f or 0)) for wh, fp, key, c, s, f in session.execute(q)
    ]


def last_seen(session: Session, since: dt.date, until: dt.date) -> dict[tuple[str, str], dt.date]:
    """(workload, target) → the last day in [since, until] with telemetry for it."""
    u = UsageDayRow
    q = (
        select(u.workload_hash, u.target_fingerprint, func.max(u.day))
        .where(u.day >= since, u.day <= until)
        .group_by(u.workload_hash, u.target_fingerprint)
    )
    return {(wh, fp): day for wh, fp, day in session.execute(q)}


def usage_by_day(session: Session, since: dt.date, until: dt.date) -> list[tuple[dt.date, str, int, float]]:
    """(day, workload, calls, kernel seconds) for days in [since, until], oldest first."""
    u = UsageDayRow
    q = (
        select(u.day, u.workload_hash, func.sum(u.calls), func.sum(u.kernel_seconds))
        .where(u.day >= since, u.day <= until)
        .group_by(u.day, u.workload_hash)
        .order_by(u.day, u.workload_hash)
    )
    return [(day, wh, int(c or 0), float(s or 0.0)) for day, wh, c, s in session.execute(q)]


def total_seconds(session: Session, since: dt.date, until: dt.date) -> float:
    q = select(func.sum(UsageDayRow.kernel_seconds)).where(UsageDayRow.day >= since, UsageDayRow.day <= until)
    return float(session.scalar(q) or 0.0)


def observed_days(session: Session, since: dt.date, until: dt.date) -> int:
    """Days in the window that have any telemetry (so a fleet that started yesterday is not diluted)."""
    q = select(func.count(func.distinct(UsageDayRow.day))).where(UsageDayRow.day >= since, UsageDayRow.day <= until)
    return int(session.scalar(q) or 0)


def claim_run(session: Session, day: dt.date, stale_after_s: float) -> bool:
    """Start the run for `day`; False when that day has one done or running (another beat, a restart).

    A run that failed, or that has been "running" for longer than `stale_after_s` (its worker died),
    is taken over: one conditional upsert, so two claimants cannot both win.
    """
    runs = cast(Table, FleetRunRow.__table__)
    now = utcnow()
    report = FleetReport(day=day, state="running", created_at=now)
    stmt = dialect_insert(session)(runs).values(
        day=day, state="running", report=report.model_dump(mode="json"), created_at=now
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=["day"],
        set_={"state": "running", "report": stmt.excluded.report, "created_at": now, "finished_at": None},
        where=(runs.c.state == "failed")
        | ((runs.c.state == "running") & (runs.c.created_at < now - dt.timedelta(seconds=stale_after_s))),
    )
    return session.execute(stmt.returning(runs.c.day)).first() is not None


def save_report(session: Session, report: FleetReport) -> None:
    row = session.get(FleetRunRow, report.day)
    assert row is not None, "a report belongs to a claimed run"
    row.state = report.state
    row.report = report.model_dump(mode="json")
    row.finished_at = report.finished_at


def reports(session: Session, limit: int = 30) -> list[FleetReport]:
    rows: Iterable[FleetRunRow] = session.scalars(select(FleetRunRow).order_by(FleetRunRow.day.desc()).limit(limit))
    return [FleetReport.model_validate(r.report) for r in rows]
