"""Operations: Prometheus metrics and a fleet status summary."""

from __future__ import annotations

import datetime as dt
import time

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.api.auth import ReadKey
from service.api.deps import SessionDep
from service.models import JobState
from service.settings import get_settings
from service.store import catalog, fleet
from service.store.tables import CandidateRow, JobRow, utcnow
from service.workers.celery_app import CONTROL_QUEUE
from service.workers.celery_app import app as celery_app

router = APIRouter(tags=["operations"])

REGISTRY = CollectorRegistry()
LOOKUP_SECONDS = Histogram(
    "kernelfleet_lookup_seconds",
    "Best-config lookup latency in the API",
    ["route"],
    registry=REGISTRY,
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
LOOKUPS = Counter("kernelfleet_lookups_total", "Best-config lookups by outcome", ["outcome"], registry=REGISTRY)
JOBS = Gauge("kernelfleet_jobs", "Jobs by state", ["state"], registry=REGISTRY)
QUEUE_DEPTH = Gauge("kernelfleet_queue_depth", "Messages waiting per broker queue", ["queue"], registry=REGISTRY)
TRIALS_PER_S = Gauge(
    "kernelfleet_trials_per_second", "Measured candidates per second, last 5 minutes", registry=REGISTRY
)
WORKERS = Gauge(
    "kernelfleet_workers_seen", "Workers that announced themselves in the last 5 minutes", registry=REGISTRY
)
FLEET_SAVINGS = Gauge(
    "kernelfleet_fleet_savings_seconds_per_day",
    "Fleet kernel time per day saved by tuning: expected (latest run's jobs) and measured (the hosts' A/B holdout)",
    ["kind"],
    registry=REGISTRY,
)
FLEET_SECONDS = Gauge(
    "kernelfleet_fleet_seconds_per_day", "Fleet kernel time per day in the latest run's window", registry=REGISTRY
)

_WINDOW = dt.timedelta(minutes=5)


def observe_lookup(route: str, started: float, hits: int, misses: int) -> None:
    LOOKUP_SECONDS.labels(route).observe(time.perf_counter() - started)
    if hits:
        LOOKUPS.labels("hit").inc(hits)
    if misses:
        LOOKUPS.labels("miss").inc(misses)


def _jobs_by_state(session: Session) -> dict[str, int]:
    rows = session.execute(select(JobRow.state, func.count()).group_by(JobRow.state)).all()
    counts = {s.value: 0 for s in JobState}
    counts.update({state: int(n) for state, n in rows})
    return counts


def _queue_depths(session: Session) -> dict[str, int | None]:
    queues = {CONTROL_QUEUE, *(q for (q,) in session.execute(select(JobRow.queue).distinct()))}
    for w in catalog.list_workers(session):
        queues.update(w.queues)
    depths: dict[str, int | None] = {}
    try:
        with celery_app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
            channel = conn.default_channel
            for q in sorted(queues):
                try:
                    depths[q] = int(channel.queue_declare(queue=q, passive=True).message_count)
                except Exception:  # a queue nobody declared yet holds nothing
                    depths[q] = 0
    except Exception:
        depths = dict.fromkeys(sorted(queues))
    return depths


def _trials_per_second(session: Session) -> float:
    since = utcnow() - _WINDOW
    n = session.scalar(select(func.count()).select_from(CandidateRow).where(CandidateRow.created_at >= since)) or 0
    return n / _WINDOW.total_seconds()


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(session: SessionDep, _: ReadKey) -> Response:
    # job counts and queue names are the fleet's business: a key with read scope, as for /v1/status
    for state, n in _jobs_by_state(session).items():
        JOBS.labels(state).set(n)
    for queue, depth in _queue_depths(session).items():
        QUEUE_DEPTH.labels(queue).set(-1 if depth is None else depth)
    TRIALS_PER_S.set(_trials_per_second(session))
    WORKERS.set(len(catalog.live_workers(session, get_settings().worker_stale_after_s)))
    latest = next((r for r in fleet.reports(session, limit=5) if r.state == "done"), None)
    if latest is not None:
        FLEET_SECONDS.set(latest.fleet_seconds_per_day)
        FLEET_SAVINGS.labels("expected").set(latest.expected_saving_s_per_day)
        FLEET_SAVINGS.labels("measured").set(latest.measured.saved_s_per_day if latest.measured else 0.0)
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)


class WorkerStatus(BaseModel):
    name: str
    queues: list[str]
    last_seen: dt.datetime
    online: bool


class FleetStatus(BaseModel):
    jobs: dict[str, int]
    queues: dict[str, int | None]
    trials_per_second: float
    workers: list[WorkerStatus]


@router.get("/v1/status", summary="Jobs by state, queue depths, throughput and workers")
def status(session: SessionDep, _: ReadKey) -> FleetStatus:
    stale_s = get_settings().worker_stale_after_s
    return FleetStatus(
        jobs=_jobs_by_state(session),
        queues=_queue_depths(session),
        trials_per_second=_trials_per_second(session),
        workers=[
            WorkerStatus(name=w.name, queues=w.queues, last_seen=w.last_seen, online=catalog.is_online(w, stale_s))
            for w in catalog.list_workers(session)
        ],
    )
