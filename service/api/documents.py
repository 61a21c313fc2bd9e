"""Store rows rendered as the documents the API serves (the SDK's wire models, kernelfleet.models).

The store answers queries with rows; what a user sees of a job, a model or a dispatch table is decided here,
once, for the routers and the dashboard alike (issue 37 item 5).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence

from sqlalchemy.orm import Session

from kernelfleet.models import DispatchDoc, ExactOverride, ModelOpView, ModelView, UKernelRef
from service.models import JobState, JobView, ShapeResult
from service.store import dispatch as dispatch_store
from service.store import jobs, models
from service.store.tables import DispatchTableRow, JobRow, ModelRow


def job_view(session: Session, row: JobRow, live_queues: Collection[str] | None = None) -> JobView:
    """The job as users see it; with `live_queues`, a queued job says when no live worker serves its queue."""
    total = max(row.trials_total, 1)
    return JobView(
        id=row.id,
        kind=row.kind,
        state=JobState(row.state),
        workload_hash=row.workload_hash,
        target=row.target,
        target_fingerprint=row.target_fingerprint,
        distribution=row.distribution,
        budget=row.budget,
        tags=row.tags,
        progress=1.0 if row.state == JobState.succeeded.value else min(1.0, row.trials_done / total),
        trials_done=row.trials_done,
        trials_total=row.trials_total,
        error=row.error,
        attempts=row.attempts,
        worker=row.worker,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        heartbeat_at=row.heartbeat_at,
        cpu_seconds=row.cpu_seconds,
        published=row.published,
        publish_reason=row.publish_reason,
        waiting_for_worker=(
            row.queue
            if live_queues is not None and row.state == JobState.queued.value and row.queue not in live_queues
            else None
        ),
        shapes=[
            ShapeResult(
                shape=s.shape,
                weight=s.weight,
                priority=s.priority,
                trials=s.trials,
                trials_done=s.trials_done,
                state=JobState(s.state),
                best_latency_s=s.best_latency_s,
                baseline=s.baseline,
                baseline_latency_s=s.baseline_latency_s,
            )
            for s in jobs.shape_rows(session, row.id)
        ],
    )


def model_view(session: Session, row: ModelRow) -> ModelView:
    """The model with its ops' jobs: states, done/total, trials, and each op's job id and progress."""
    ops = models.op_rows(session, row.id)
    job_rows = models.op_jobs(session, ops)
    op_names = models.op_names(session, ops)
    shares = row.split.get("ops", [])
    views, states, done, total = [], [], 0, 0
    for o in ops:
        job = job_rows.get(o.job_id) if o.job_id else None
        share = next((s.get("share", 0.0) for s in shares if s.get("name") == o.name), 0.0)
        op_view = ModelOpView(
            name=o.name,
            op=op_names.get(o.workload_hash, "?"),
            workload_hash=o.workload_hash,
            occurrences=o.occurrences,
            dims=o.dims,
            priority=o.priority,
            share=share,
            trials=o.trials,
            skipped=o.skipped,
            job_id=o.job_id,
        )
        if job is not None:
            succeeded = job.state == JobState.succeeded.value
            op_view.state = job.state
            op_view.trials_done, op_view.trials_total = job.trials_done, job.trials_total
            op_view.progress = 1.0 if succeeded else min(1.0, job.trials_done / max(job.trials_total, 1))
            op_view.error = job.error
            states.append(job.state)
            # a finished job counts as all its planned trials (a sketch search can stop early)
            done += job.trials_total if succeeded else min(job.trials_done, job.trials_total)
            total += job.trials_total
        views.append(op_view)
    state = models.aggregate_state(states)
    return ModelView(
        id=row.id,
        name=row.name,
        kind=row.kind,
        target=row.target,
        state=state,
        progress=1.0 if state == JobState.succeeded.value else (done / total if total else 0.0),
        jobs_total=len(states),
        jobs_done=sum(JobState(s).terminal for s in states),
        states=dict(Counter(states)),
        trials_done=done,
        trials_total=total,
        budget=row.budget,
        budget_split=row.split,
        tags=row.tags,
        ops=views,
        created_at=row.created_at,
    )


def dispatch_document(
    session: Session, row: DispatchTableRow, keys: Sequence[tuple[str, int, float, float | None]] | None = None
) -> DispatchDoc:
    """A published table as GET /v1/dispatch serves it, with the exact-shape overrides `keys` names (default: every
    stored config faster than the table at its S, dispatch_store.override_keys)."""
    arts = dispatch_store.table_artifacts(session, row)
    refs = [
        UKernelRef(id=u["id"], sha256=arts[u["sha256"]].sha256, spec=arts[u["sha256"]].spec,
                   size_bytes=arts[u["sha256"]].size_bytes)
        for u in row.ukernels
    ]  # fmt: skip
    keys = dispatch_store.override_keys(session, row) if keys is None else keys
    configs = dispatch_store.override_configs(session, row, keys)
    return DispatchDoc(
        workload_hash=row.workload_hash,
        target_fingerprint=row.target_fingerprint,
        dim=row.dim,
        s_max=row.s_max,
        table=row.table,
        ukernels=refs,
        predicted_latency_s=row.predicted,
        measured_latency_s=row.measured,
        overrides=[
            ExactOverride(S=S, latency_s=latency, table_latency_s=ours, config=configs[key])
            for key, S, latency, ours in keys
            if key in configs
        ],
        validation=row.validation,
        job_id=row.job_id,
        created_at=row.created_at,
    )
