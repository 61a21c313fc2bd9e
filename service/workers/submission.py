"""Submitting a job: durable in the store first, then published; shared by the API and the fleet cron."""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from service.models import JobSpec
from service.store import catalog, jobs
from service.store.tables import JobRow
from service.tuning.kinds import KINDS
from service.tuning.platforms import queue_for
from service.workers.celery_app import enqueue

log = logging.getLogger(__name__)


def submit(session: Session, spec: JobSpec, workload_hash: str, owner_key_id: str | None = None) -> JobRow:
    row = create(session, spec, workload_hash, owner_key_id)
    session.commit()  # the job is durable before its message exists: the reaper re-sends undispatched jobs
    enqueue_jobs(session, [row])
    return row


def create(session: Session, spec: JobSpec, workload_hash: str, owner_key_id: str | None = None) -> JobRow:
    """The queued job row, not committed: commit (with whatever belongs with it), then `enqueue_jobs`."""
    workload = catalog.get_workload(session, workload_hash)
    if workload is None:
        raise ValueError(f"workload {workload_hash} is not registered")
    # progress counts to what the kind plans, from the first poll on (the worker plans the same way)
    planned = KINDS.get(spec.kind).plan(workload, spec.distribution, spec.budget)
    return jobs.create_job(
        session,
        spec,
        workload_hash,
        owner_key_id=owner_key_id,
        queue=queue_for(spec.target),
        trials_total=planned.trials_total,
    )


def enqueue_jobs(session: Session, rows: list[JobRow]) -> None:
    """Send committed jobs' messages; a job whose message cannot be sent stays queued for the reaper."""
    for row in rows:
        try:
            enqueue(row.id, row.queue)
            jobs.mark_dispatched(session, row.id)
        except Exception:
            log.exception("broker unavailable; job %s stays queued and the reaper will dispatch it", row.id)
