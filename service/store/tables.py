"""SQLAlchemy 2 tables: workloads, targets, models and their ops, jobs, per-shape job progress, candidates, best
configs, dispatch tables, artifacts, workers, API keys."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Date,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Stored as naive UTC on every backend, returned timezone-aware, so comparisons agree on SQLite too."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are ambiguous; use timezone-aware UTC")
        return value.astimezone(dt.UTC).replace(tzinfo=None)

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        return None if value is None else value.replace(tzinfo=dt.UTC)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON, dt.datetime: UTCDateTime}


class WorkloadRow(Base):
    __tablename__ = "workloads"
    workload_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    op: Mapped[str] = mapped_column(String(32))
    spec: Mapped[dict[str, Any]]
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class TargetRow(Base):
    __tablename__ = "targets"
    target_fingerprint: Mapped[str] = mapped_column(String(64), primary_key=True)
    spec: Mapped[dict[str, Any]]
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class JobRow(Base):
    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16), index=True)
    workload_hash: Mapped[str] = mapped_column(ForeignKey("workloads.workload_hash"), index=True)
    target: Mapped[dict[str, Any]]
    target_fingerprint: Mapped[str | None] = mapped_column(String(64))
    queue: Mapped[str] = mapped_column(String(64))
    distribution: Mapped[dict[str, Any]]
    budget: Mapped[dict[str, Any]]
    tags: Mapped[dict[str, Any]]
    trials_done: Mapped[int] = mapped_column(default=0)
    trials_total: Mapped[int] = mapped_column(default=0)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(default=0)
    worker: Mapped[str | None] = mapped_column(String(200))
    lease: Mapped[str | None] = mapped_column(String(36))
    dispatched: Mapped[bool] = mapped_column(Boolean, default=False)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # whether the job published anything (a config or a dispatch table; None until it finishes), and why
    # something was held back, e.g. the vendor was faster as the SDK calls both
    published: Mapped[bool | None] = mapped_column(Boolean)
    publish_reason: Mapped[str | None] = mapped_column(Text)
    owner_key_id: Mapped[str | None] = mapped_column(String(36), index=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, index=True)
    started_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None]
    heartbeat_at: Mapped[dt.datetime | None]
    # CPU seconds (user + system) of every attempt that ended in its worker, its child processes included
    cpu_seconds: Mapped[float | None] = mapped_column(Float)


class ModelRow(Base):
    """A model onboarded in one request: its ops (ModelOpRow) link it to their workloads and jobs."""

    __tablename__ = "models"
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    target: Mapped[dict[str, Any]]
    budget: Mapped[dict[str, Any]]
    split: Mapped[dict[str, Any]]  # how the budget was split between the ops' jobs, as the response says
    tags: Mapped[dict[str, Any]]
    owner_key_id: Mapped[str | None] = mapped_column(String(36), index=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow, index=True)


class ModelOpRow(Base):
    """One op of a model: its workload, its job (None when the op was skipped, with why) and its budget share."""

    __tablename__ = "model_ops"
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id"), primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    workload_hash: Mapped[str] = mapped_column(ForeignKey("workloads.workload_hash"))
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id"), index=True)
    occurrences: Mapped[int]
    distribution: Mapped[dict[str, Any]]
    dims: Mapped[dict[str, Any]]  # provenance: int or expression of the model's inputs per dim
    sources: Mapped[list[Any]]
    priority: Mapped[float] = mapped_column(Float)
    trials: Mapped[int] = mapped_column(default=0)
    skipped: Mapped[str | None] = mapped_column(Text)


class JobShapeRow(Base):
    __tablename__ = "job_shapes"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    shape_key: Mapped[str] = mapped_column(String(200), primary_key=True)
    shape: Mapped[dict[str, Any]]
    weight: Mapped[float] = mapped_column(Float)
    priority: Mapped[float] = mapped_column(Float)
    trials: Mapped[int]
    trials_done: Mapped[int] = mapped_column(default=0)
    state: Mapped[str] = mapped_column(String(16), default="queued")
    best_latency_s: Mapped[float | None] = mapped_column(Float)
    baseline: Mapped[str | None] = mapped_column(String(200))
    baseline_latency_s: Mapped[float | None] = mapped_column(Float)
    rank: Mapped[int] = mapped_column(Integer, default=0)


class CandidateRow(Base):
    """Every measured candidate, kept so configs can be re-selected later without re-measuring."""

    __tablename__ = "candidates"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    workload_hash: Mapped[str] = mapped_column(String(64))
    target_fingerprint: Mapped[str] = mapped_column(String(64))
    shape_key: Mapped[str] = mapped_column(String(200))
    config: Mapped[dict[str, Any]]
    latency_s: Mapped[float | None] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16))  # ok | error | timeout
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_candidates_key", "workload_hash", "target_fingerprint", "shape_key"),)


class BestConfigRow(Base):
    __tablename__ = "best_configs"
    workload_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    target_fingerprint: Mapped[str] = mapped_column(String(64), primary_key=True)
    shape_key: Mapped[str] = mapped_column(String(200), primary_key=True)
    shape: Mapped[dict[str, Any]]
    latency_s: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    config: Mapped[dict[str, Any]]
    provenance: Mapped[dict[str, Any]]
    job_id: Mapped[str | None] = mapped_column(String(36))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class DispatchTableRow(Base):
    """A `ukernel` job's dispatch table. Every published table is kept; lookups serve the newest."""

    __tablename__ = "dispatch_tables"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    workload_hash: Mapped[str] = mapped_column(String(64))
    target_fingerprint: Mapped[str] = mapped_column(String(64))
    dim: Mapped[str] = mapped_column(String(64))
    s_max: Mapped[int]
    table: Mapped[dict[str, Any]]
    ukernels: Mapped[list[Any]]
    predicted: Mapped[list[Any]]
    measured: Mapped[dict[str, Any]]
    validation: Mapped[dict[str, Any]]
    job_id: Mapped[str | None] = mapped_column(String(36))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    # set when the fleet run rolled the table back (slower than what it replaced, on production telemetry): never
    # served again; the newest table not retired is
    retired_at: Mapped[dt.datetime | None]
    retired_reason: Mapped[str | None] = mapped_column(String(500))

    __table_args__ = (Index("ix_dispatch_tables_key", "workload_hash", "target_fingerprint", "id"),)


class ArtifactRow(Base):
    """A compiled library, content-addressed: the key is the sha256 of `data`, so a row never changes."""

    __tablename__ = "artifacts"
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    target_fingerprint: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(32))
    spec: Mapped[dict[str, Any]]
    size_bytes: Mapped[int]
    data: Mapped[bytes] = mapped_column(LargeBinary, deferred=True)  # loaded only when the bytes are served
    job_id: Mapped[str | None] = mapped_column(String(36))
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class TelemetryBatchRow(Base):
    """Batches already counted, by the id their sender chose: a resent batch is recognised and ignored."""

    __tablename__ = "telemetry_batches"
    batch_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    key_id: Mapped[str | None] = mapped_column(String(36))
    host: Mapped[str] = mapped_column(String(200))
    records: Mapped[int]
    received_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class UsageDayRow(Base):
    """The fleet's kernel time per UTC day and (workload, target, shape), summed over telemetry batches."""

    __tablename__ = "fleet_usage"
    day: Mapped[dt.date] = mapped_column(Date, primary_key=True)
    workload_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    target_fingerprint: Mapped[str] = mapped_column(String(64), primary_key=True)
    shape_key: Mapped[str] = mapped_column(String(200), primary_key=True)
    calls: Mapped[int] = mapped_column(BigInteger, default=0)
    kernel_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    fallbacks: Mapped[int] = mapped_column(BigInteger, default=0)


class HoldoutDayRow(Base):
    """The hosts' A/B holdout per UTC day, (workload, target), the table that served, shape and the baseline the
    hosts held calls out for: both sides' calls, seconds and squared seconds, summed over telemetry batches
    (kernelfleet.holdout). Hosts with different baselines are never summed together."""

    __tablename__ = "fleet_holdout"
    day: Mapped[dt.date] = mapped_column(Date, primary_key=True)
    workload_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    target_fingerprint: Mapped[str] = mapped_column(String(64), primary_key=True)
    table_job_id: Mapped[str] = mapped_column(String(64), primary_key=True)  # "" where no table served
    shape_key: Mapped[str] = mapped_column(String(200), primary_key=True)
    baseline: Mapped[str] = mapped_column(String(64), primary_key=True)  # what the held-out calls ran, e.g. "torch"
    served_calls: Mapped[int] = mapped_column(BigInteger, default=0)
    served_s: Mapped[float] = mapped_column(Float, default=0.0)
    served_s2: Mapped[float] = mapped_column(Float, default=0.0)
    baseline_calls: Mapped[int] = mapped_column(BigInteger, default=0)
    baseline_s: Mapped[float] = mapped_column(Float, default=0.0)
    baseline_s2: Mapped[float] = mapped_column(Float, default=0.0)


class FleetRunRow(Base):
    """One daily tuning run; the day is the key, so a day runs once however many beats fire."""

    __tablename__ = "fleet_runs"
    day: Mapped[dt.date] = mapped_column(Date, primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    report: Mapped[dict[str, Any]]
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[dt.datetime | None]


class WorkerRow(Base):
    """Workers announce themselves so users can see which hardware the fleet can tune for."""

    __tablename__ = "workers"
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    queues: Mapped[list[Any]]
    target: Mapped[dict[str, Any]]
    target_fingerprint: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    last_seen: Mapped[dt.datetime] = mapped_column(default=utcnow)


class ApiKeyRow(Base):
    """API keys are stored as SHA-256 hashes of 256-bit random secrets; the secret itself never is."""

    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[Any]]
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[dt.datetime | None]
