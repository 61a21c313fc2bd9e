"""Job rows and their state machine: queued → running → succeeded / failed / cancelled.

Ownership of a running job is a lease (a random token) renewed by heartbeats. Every transition is
one conditional UPDATE, so a redelivered message, a second worker or a second reaper can never run
or finish the same job twice.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, func, select, update
from sqlalchemy.orm import Session

from service.models import JobState, shape_key
from service.models.job import JobSpec
from service.models.plan import PlannedShape
from service.store.tables import CandidateRow, JobRow, JobShapeRow, utcnow


def _count(result: Any) -> int:
    """Rows an UPDATE matched (every transition here is one conditional UPDATE)."""
    return int(result.rowcount)


def create_job(
    session: Session,
    spec: JobSpec,
    workload_hash: str,
    owner_key_id: str | None = None,
    *,
    queue: str,
    trials_total: int | None = None,
) -> JobRow:
    """A queued job whose message goes to `queue` (the engine names it: the store knows no platforms)."""
    row = JobRow(
        id=str(uuid.uuid4()),
        kind=spec.kind,
        state=JobState.queued.value,
        workload_hash=workload_hash,
        target=spec.target.model_dump(),
        queue=queue,
        distribution=spec.distribution.model_dump(),
        budget=spec.budget.model_dump(),
        tags=spec.tags,
        trials_total=spec.budget.trials if trials_total is None else trials_total,
        created_at=utcnow(),
        owner_key_id=owner_key_id,
    )
    session.add(row)
    session.flush()
    return row


def mark_dispatched(session: Session, job_id: str) -> None:
    session.execute(update(JobRow).where(JobRow.id == job_id).values(dispatched=True))


def undispatched(session: Session) -> list[tuple[str, str]]:
    """Queued jobs whose broker message was never sent (or must be re-sent): (id, queue)."""
    rows = session.execute(
        select(JobRow.id, JobRow.queue).where(JobRow.state == JobState.queued.value, JobRow.dispatched.is_(False))
    )
    return [(r.id, r.queue) for r in rows]


def claim(session: Session, job_id: str, worker: str, stale_after_s: float) -> str | None:
    """Take ownership of a queued job (or of a running one whose owner stopped heartbeating)."""
    now = utcnow()
    lease = str(uuid.uuid4())
    stale = now - dt.timedelta(seconds=stale_after_s)
    result = session.execute(
        update(JobRow)
        .where(
            JobRow.id == job_id,
            JobRow.cancel_requested.is_(False),
            (JobRow.state == JobState.queued.value)
            | ((JobRow.state == JobState.running.value) & (JobRow.heartbeat_at < stale)),
        )
        .values(
            state=JobState.running.value,
            lease=lease,
            worker=worker,
            attempts=JobRow.attempts + 1,
            heartbeat_at=now,
            started_at=func.coalesce(JobRow.started_at, now),
            error=None,
        )
    )
    return lease if result.rowcount == 1 else None  # type: ignore[attr-defined]


def heartbeat(session: Session, job_id: str, lease: str) -> bool:
    """Renew the lease; False when the job was cancelled or another worker took it over."""
    result = session.execute(
        update(JobRow)
        .where(
            JobRow.id == job_id,
            JobRow.lease == lease,
            JobRow.state == JobState.running.value,
            JobRow.cancel_requested.is_(False),
        )
        .values(heartbeat_at=utcnow())
    )
    return _count(result) == 1


def add_cpu_seconds(session: Session, job_id: str, seconds: float) -> None:
    """Count an attempt's CPU seconds on the job, whatever became of the attempt (its lease may be gone)."""
    session.execute(
        update(JobRow)
        .where(JobRow.id == job_id)
        .values(cpu_seconds=func.coalesce(JobRow.cpu_seconds, 0.0) + max(0.0, seconds))
    )


def finish(session: Session, job_id: str, lease: str, state: JobState, error: str | None = None) -> bool:
    values: dict[str, object] = {"state": state.value, "finished_at": utcnow(), "lease": None}
    if error is not None:
        values["error"] = error[:4000]
    result = session.execute(
        update(JobRow)
        .where(JobRow.id == job_id, JobRow.lease == lease, JobRow.state == JobState.running.value)
        .values(**values)
    )
    return _count(result) == 1


MAX_REASON_CHARS = 4000


def record_publication(session: Session, job_id: str, published: bool, reasons: Sequence[str] = ()) -> None:
    """Add what one unit published: `published` accumulates (any unit that published makes the job
    published), and each reason something was held back is appended."""
    row = session.get(JobRow, job_id, with_for_update=True)
    if row is None:
        return
    if published:
        row.published = True
    if reasons:
        text = "; ".join([*(row.publish_reason.split("; ") if row.publish_reason else []), *reasons])
        row.publish_reason = text[:MAX_REASON_CHARS]


def finish_publication(session: Session, job_id: str) -> None:
    """At the end of a job that succeeded: a job no unit published from is `published: false`."""
    row = session.get(JobRow, job_id)
    if row is not None and row.published is None:
        row.published = False
        row.publish_reason = row.publish_reason or "nothing was published"


def resolve_target(session: Session, job_id: str, fingerprint: str) -> None:
    session.execute(update(JobRow).where(JobRow.id == job_id).values(target_fingerprint=fingerprint))


def request_cancel(session: Session, job_id: str) -> JobState | None:
    """Queued jobs are cancelled at once; running ones stop at their next heartbeat."""
    row = session.get(JobRow, job_id)
    if row is None:
        return None
    state = JobState(row.state)
    if state.terminal:
        return state
    row.cancel_requested = True
    if state is JobState.queued:
        row.state, row.finished_at = JobState.cancelled.value, utcnow()
    return JobState(row.state)


def confirm_cancelled(session: Session, job_id: str) -> None:
    session.execute(
        update(JobRow)
        .where(JobRow.id == job_id, JobRow.state == JobState.running.value)
        .values(state=JobState.cancelled.value, finished_at=utcnow(), lease=None)
    )


def plan_shapes(
    session: Session, job_id: str, planned: Sequence[PlannedShape], trials_total: int | None = None
) -> list[JobShapeRow]:
    """Persist the job's shape plan once; a redelivered job keeps its plan and what it finished. The job's
    progress counts to `trials_total` (default: the shapes' trials)."""
    existing = list(session.scalars(select(JobShapeRow).where(JobShapeRow.job_id == job_id).order_by(JobShapeRow.rank)))
    if existing:
        return existing
    rows = [
        JobShapeRow(
            job_id=job_id,
            shape_key=shape_key(p.shape),
            shape=p.shape,
            weight=p.weight,
            priority=p.priority,
            trials=p.trials,
            rank=i,
            state=JobState.queued.value,
        )
        for i, p in enumerate(planned)
    ]
    session.add_all(rows)
    total = sum(p.trials for p in planned) if trials_total is None else trials_total
    session.execute(update(JobRow).where(JobRow.id == job_id).values(trials_total=total))
    return rows


def count_shapes(session: Session, job_id: str, state: JobState) -> int:
    q = select(func.count()).where(JobShapeRow.job_id == job_id, JobShapeRow.state == state.value)
    return session.scalar(q) or 0


def update_shape(session: Session, job_id: str, key: str, **values: object) -> None:
    session.execute(
        update(JobShapeRow).where(JobShapeRow.job_id == job_id, JobShapeRow.shape_key == key).values(**values)
    )


def add_progress(session: Session, job_id: str, key: str | None, trials: int) -> None:
    """Count trials done for a shape row (and the job), or for the job alone when `key` is None."""
    if key is not None:
        session.execute(
            update(JobShapeRow)
            .where(JobShapeRow.job_id == job_id, JobShapeRow.shape_key == key)
            .values(trials_done=JobShapeRow.trials_done + trials)
        )
    session.execute(update(JobRow).where(JobRow.id == job_id).values(trials_done=JobRow.trials_done + trials))


def reset_unfinished_progress(session: Session, job_id: str) -> None:
    """A resumed job counts only the trials of the shapes it had finished."""
    session.execute(
        update(JobShapeRow)
        .where(JobShapeRow.job_id == job_id, JobShapeRow.state != JobState.succeeded.value)
        .values(trials_done=0)
    )
    done = select(func.coalesce(func.sum(JobShapeRow.trials_done), 0)).where(JobShapeRow.job_id == job_id)
    session.execute(update(JobRow).where(JobRow.id == job_id).values(trials_done=done.scalar_subquery()))


@dataclass(frozen=True)
class Reaped:
    requeued: list[str]
    failed: list[str]


def reap_stale(session: Session, stale_after_s: float, max_attempts: int) -> Reaped:
    """Requeue (or fail, once out of attempts) running jobs whose worker stopped heartbeating."""
    stale = JobRow.heartbeat_at < utcnow() - dt.timedelta(seconds=stale_after_s)
    return _requeue_or_fail(session, stale, max_attempts, "stopped heartbeating")


def release_orphans(session: Session, node: str, started_at: dt.datetime, max_attempts: int) -> Reaped:
    """Requeue (or fail, once out of attempts) the running jobs of earlier processes of worker node `node`.

    Called by a worker starting under that node name. Node names are unique among live workers, so a job that
    a process of this name held and last renewed before this process started belongs to a process that
    died (killed, or its container restarted): it need not wait for its heartbeat to go stale."""
    # the worker column holds "<node>:<pid>" (service.workers.tasks.worker_id)
    mine = JobRow.worker.startswith(f"{node}:", autoescape=True) & (JobRow.heartbeat_at < started_at)
    return _requeue_or_fail(session, mine, max_attempts, f"died: {node} restarted")


def _requeue_or_fail(session: Session, orphaned: ColumnElement[bool], max_attempts: int, why: str) -> Reaped:
    running = JobRow.state == JobState.running.value
    rows = session.execute(select(JobRow.id, JobRow.attempts, JobRow.worker).where(running, orphaned)).all()
    requeued, failed = [], []
    for job_id, attempts, worker in rows:
        guard = (JobRow.id == job_id) & running & orphaned
        if attempts >= max_attempts:
            reason = f"worker {worker} {why}; gave up after {attempts} attempts"
            done = session.execute(
                update(JobRow)
                .where(guard)
                .values(state=JobState.failed.value, error=reason, finished_at=utcnow(), lease=None)
            )
            if _count(done):
                failed.append(job_id)
        else:
            done = session.execute(
                update(JobRow)
                .where(guard)
                .values(
                    state=JobState.queued.value, lease=None, dispatched=False, error=f"requeued: worker {worker} {why}"
                )
            )
            if _count(done):
                requeued.append(job_id)
    return Reaped(requeued, failed)


def no_worker_reason(queue: str, waited_s: float | None = None) -> str:
    waited = f" for {waited_s:.0f} s" if waited_s is not None else ""
    return (
        f"no live worker consumes queue {queue!r}{waited}: start a worker on that hardware, or submit for a "
        "target the fleet serves (`kernelfleet targets`, or target mcpu 'host')"
    )


def fail_unserved(session: Session, live_queues: Collection[str], deadline_s: float) -> list[str]:
    """Fail queued jobs that waited longer than `deadline_s` on a queue no live worker consumes.

    A job waits from its submission, or from its last heartbeat when it was requeued after its worker died.
    Its broker message stays behind: a worker that appears later finds the job failed and skips it; the
    user resubmits.
    """
    cutoff = utcnow() - dt.timedelta(seconds=deadline_s)
    waiting_since = func.coalesce(JobRow.heartbeat_at, JobRow.created_at)
    rows = session.execute(
        select(JobRow.id, JobRow.queue).where(
            JobRow.state == JobState.queued.value, JobRow.queue.not_in(list(live_queues)), waiting_since < cutoff
        )
    ).all()
    failed = []
    for job_id, queue in rows:
        done = session.execute(
            update(JobRow)
            .where((JobRow.id == job_id) & (JobRow.state == JobState.queued.value))
            .values(state=JobState.failed.value, error=no_worker_reason(queue, deadline_s), finished_at=utcnow())
        )
        if _count(done):
            failed.append(job_id)
    return failed


def get_row(session: Session, job_id: str) -> JobRow | None:
    return session.get(JobRow, job_id)


def shape_rows(session: Session, job_id: str) -> list[JobShapeRow]:
    """A job's shapes in their planned order."""
    return list(session.scalars(select(JobShapeRow).where(JobShapeRow.job_id == job_id).order_by(JobShapeRow.rank)))


def list_rows(
    session: Session,
    state: JobState | None,
    kind: str | None,
    workload_hash: str | None,
    limit: int,
    offset: int,
    target_fingerprint: str | None = None,
) -> tuple[list[JobRow], int]:
    q = select(JobRow)
    if state:
        q = q.where(JobRow.state == state.value)
    if kind:
        q = q.where(JobRow.kind == kind)
    if workload_hash:
        q = q.where(JobRow.workload_hash == workload_hash)
    if target_fingerprint:
        q = q.where(JobRow.target_fingerprint == target_fingerprint)
    total = session.scalar(select(func.count()).select_from(q.subquery())) or 0
    rows = list(session.scalars(q.order_by(JobRow.created_at.desc()).limit(limit).offset(offset)))
    return rows, total


def candidates(session: Session, job_id: str, limit: int, offset: int) -> list[CandidateRow]:
    q = select(CandidateRow).where(CandidateRow.job_id == job_id).order_by(CandidateRow.id)
    return list(session.scalars(q.limit(limit).offset(offset)))


def count_candidates(session: Session, job_id: str) -> int:
    return session.scalar(select(func.count()).where(CandidateRow.job_id == job_id)) or 0


def rows_on_target_kind(session: Session, target_kind: str, limit: int) -> list[JobRow]:
    """The newest jobs for targets of one kind (e.g. every Gemmini job, whatever its job kind)."""
    q = select(JobRow).where(JobRow.target["kind"].as_string() == target_kind)
    return list(session.scalars(q.order_by(JobRow.created_at.desc()).limit(limit)))


def distinct_kinds(session: Session) -> list[str]:
    return list(session.scalars(select(JobRow.kind).distinct().order_by(JobRow.kind)))
