"""Runs one tuning job end to end against the store. Free of Celery: the task only calls `run_job`.

The runner knows no job kind and no platform by name: it looks both up in their registries, persists
the kind's plan, runs each unfinished work unit through the kind and publishes what the unit returns,
atomically and only while it holds the job's lease. A job is resumable: its plan and each finished
unit are persisted, so a job redelivered after a worker died continues with the units it had not
finished, and every measured candidate is stored as it comes, so a kind resumes an unfinished unit from
what earlier attempts measured (`JobSink.earlier_candidates`). Each attempt works in a directory of its
own (service.workers.scratch) that the next attempt removes if this one was killed.
"""

from __future__ import annotations

import contextlib
import logging
import math
import resource
import shutil
import tempfile
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path

from pydantic import TypeAdapter
from sqlalchemy.orm import Session

from service.logs import for_job
from service.models import Budget, ConfigRecord, JobState, TargetSpec, shape_key
from service.models.config import MeasuredCandidate
from service.models.distribution import ShapeDistribution
from service.settings import Settings
from service.store import catalog, configs, jobs
from service.store import dispatch as dispatch_store
from service.store.db import session_scope
from service.tuning.kinds import (
    KINDS,
    DispatchPublication,
    JobKind,
    ShapeOutcome,
    UnitContext,
    UnitResult,
    WorkUnit,
    unit_done,
)
from service.tuning.platforms import platform_for
from service.tuning.tuners.base import TuningStopped
from service.workers import scratch

log = logging.getLogger(__name__)


class Heartbeat:
    """Renews the job's lease in the background; `lost` is set once the job is cancelled or taken over."""

    def __init__(self, job_id: str, lease: str, interval_s: float) -> None:
        self.job_id, self.lease, self.interval_s = job_id, lease, interval_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{job_id[:8]}", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                with session_scope() as s:
                    alive = jobs.heartbeat(s, self.job_id, self.lease)
            except Exception:  # a database blip must not kill the job; the next beat retries
                log.exception("heartbeat failed for job %s", self.job_id)
                continue
            if not alive:
                self.lost.set()
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class _StoreSink:
    """What a kind reports while it tunes: candidates kept forever, progress counted, stop requests."""

    def __init__(self, job_id: str, workload_hash: str, fingerprint: str, shape_keys: set[str], hb: Heartbeat):
        self.job_id, self.workload_hash, self.fingerprint = job_id, workload_hash, fingerprint
        self.shape_keys, self.hb = shape_keys, hb

    def on_candidates(self, unit_key: str, candidates: list[MeasuredCandidate]) -> None:
        with session_scope() as s:
            configs.record_candidates(s, self.job_id, self.workload_hash, self.fingerprint, unit_key, candidates)
            jobs.add_progress(s, self.job_id, unit_key if unit_key in self.shape_keys else None, len(candidates))

    def on_progress(self, shape_key: str | None, trials: int) -> None:
        with session_scope() as s:
            jobs.add_progress(s, self.job_id, shape_key if shape_key in self.shape_keys else None, trials)

    def earlier_candidates(self, unit_key: str) -> list[MeasuredCandidate]:
        with session_scope() as s:
            return configs.job_candidates(s, self.job_id, self.fingerprint, unit_key)

    def target_candidates(self, config_format: str, limit: int) -> list[MeasuredCandidate]:
        with session_scope() as s:
            return configs.target_candidates(s, self.fingerprint, config_format, limit)

    def should_stop(self) -> bool:
        return self.hb.lost.is_set()


def run_job(job_id: str, worker: str, settings: Settings) -> str:
    """Claim and run a job; returns what happened: succeeded, failed, cancelled, lost-lease, busy (another live
    worker runs it) or skipped (nothing left to do)."""
    with session_scope() as s:
        lease = jobs.claim(s, job_id, worker, settings.stale_after_s)
        if lease is None:
            row = jobs.get_row(s, job_id)
            # 'busy': a live worker owns it; the caller keeps a message around in case that worker dies
            return "busy" if row is not None and row.state == JobState.running.value else "skipped"
    work_dir = scratch.attempt_dir(settings, worker, job_id, lease)
    cpu_at_start = _cpu_seconds()
    with Heartbeat(job_id, lease, settings.heartbeat_interval_s) as hb, _counting_cpu(job_id, cpu_at_start):
        try:
            # A killed attempt's files are still on disk (SIGKILL runs no cleanup): this attempt removes them,
            # and its own when it ends, however it ends short of being killed itself.
            scratch.sweep_job(settings, job_id, keep=work_dir)
            work_dir.mkdir(parents=True)
            return _run_claimed(job_id, lease, worker, hb, settings, work_dir)
        except TuningStopped:
            return _stopped(job_id)
        except Exception as exc:
            for_job(log, job_id).exception("job failed")
            detail = "".join(traceback.format_exception_only(exc)).strip()
            return _fail(job_id, lease, f"{type(exc).__name__}: {detail}")
        finally:
            shutil.rmtree(work_dir, ignore_errors=True)


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its children that have been waited for (TVM's builders)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@contextlib.contextmanager
def _counting_cpu(job_id: str, start: float) -> Iterator[None]:
    """On the way out of an attempt, however it ends short of a kill, add its CPU seconds to the job (issue 35
    item 2: the fleet's cost in CPU seconds as well as worker seconds). A worker runs one job per process at a
    time (Celery's prefork pool), so the process's CPU time over the attempt is the attempt's."""
    try:
        yield
    finally:
        try:
            with session_scope() as s:
                jobs.add_cpu_seconds(s, job_id, _cpu_seconds() - start)
        except Exception:  # the store may be down: the attempt's outcome matters more than its bill
            log.exception("could not record the CPU seconds of job %s", job_id)


def _stopped(job_id: str) -> str:
    with session_scope() as s:
        row = jobs.get_row(s, job_id)
        if row is not None and row.cancel_requested:
            jobs.confirm_cancelled(s, job_id)
            return "cancelled"
    return "lost-lease"


def _fail(job_id: str, lease: str, reason: str) -> str:
    with session_scope() as s:
        jobs.finish(s, job_id, lease, JobState.failed, reason)
    return "failed"


def _run_claimed(job_id: str, lease: str, worker: str, hb: Heartbeat, settings: Settings, work_dir: Path) -> str:
    with session_scope() as s:
        row = jobs.get_row(s, job_id)
        assert row is not None
        workload = catalog.get_workload(s, row.workload_hash)
        kind_name, target, budget, dist = row.kind, TargetSpec(**row.target), Budget(**row.budget), row.distribution
        tags = dict(row.tags or {})
    if workload is None:
        return _fail(job_id, lease, f"workload {row.workload_hash} is not registered")
    try:
        kind = KINDS.get(kind_name)
    except KeyError as exc:
        return _fail(job_id, lease, f"this worker cannot run the job: {exc.args[0]}")
    platform = platform_for(target)
    problem = platform.mismatch(target)
    if problem:
        return _fail(job_id, lease, problem)
    local = platform.toolchain()
    if target.toolchain is not None and target.toolchain != local:
        return _fail(job_id, lease, f"job asks for toolchain {target.toolchain}, this worker has {local}")
    target = platform.resolve(target)
    distribution: ShapeDistribution = TypeAdapter(ShapeDistribution).validate_python(dist)
    plan = kind.plan(workload, distribution, budget)
    with session_scope() as s:
        catalog.put_target(s, target)
        jobs.resolve_target(s, job_id, target.fingerprint)
        rows = jobs.plan_shapes(s, job_id, plan.shapes, trials_total=plan.trials_total)
        jobs.reset_unfinished_progress(s, job_id)
        todo = [u for u in plan.units if not unit_done(rows, u)]

    shape_keys = {shape_key(p.shape) for p in plan.shapes}
    sink = _StoreSink(job_id, workload.workload_hash, target.fingerprint, shape_keys, hb)
    for unit in todo:
        if hb.lost.is_set():
            raise TuningStopped("stopped by the job")
        with session_scope() as s:
            for key in unit.shape_keys:
                jobs.update_shape(s, job_id, key, state=JobState.running.value, trials_done=0)
        with tempfile.TemporaryDirectory(prefix="unit-", dir=work_dir) as tmp:
            ctx = UnitContext(
                job_id, worker, workload, target, platform, distribution, budget, settings, Path(tmp), sink, tags
            )
            result = kind.run_unit(unit, ctx)
            if result.fatal:
                return _fail(job_id, lease, result.fatal)
            _publish(job_id, lease, hb, kind, unit, ctx, result)

    with session_scope() as s:
        # counted from the store, so shapes finished by an earlier attempt of a resumed job count too
        if not jobs.count_shapes(s, job_id, JobState.succeeded):
            jobs.finish(s, job_id, lease, JobState.failed, "no shape produced a verified config")
            return "failed"
        jobs.finish_publication(s, job_id)  # succeeded and published nothing: the view says so, and why
        jobs.finish(s, job_id, lease, JobState.succeeded)
    return "succeeded"


def _publish(
    job_id: str, lease: str, hb: Heartbeat, kind: JobKind, unit: WorkUnit, ctx: UnitContext, result: UnitResult
) -> None:
    """Store what a unit produced in one transaction, and only while this worker still holds the lease: a
    cancelled or taken-over job publishes nothing."""
    fingerprint = ctx.target.fingerprint
    with session_scope() as s:
        if hb.lost.is_set() or not jobs.heartbeat(s, job_id, lease):
            raise TuningStopped("stopped by the job")
        if result.dispatch is not None and result.not_published is None:
            result.not_published = slower_than_current(
                s, ctx.workload.workload_hash, fingerprint, result.dispatch, ctx.settings.table_regression_ratio
            )
            if result.not_published is not None:
                result.dispatch = None
        if result.dispatch is not None:
            d = result.dispatch
            dispatch_store.publish(
                s,
                workload_hash=ctx.workload.workload_hash,
                target_fingerprint=fingerprint,
                dim=d.dim,
                table=d.table.to_json(),
                artifacts=d.artifacts,
                predicted=d.predicted,
                measured=d.measured,
                validation=d.validation,
                job_id=job_id,
            )
        for outcome in result.shapes:
            _publish_shape(s, job_id, kind, ctx, outcome)
        published = result.dispatch is not None or any(_serves(o) for o in result.shapes)
        reasons = [f"{shape_key(o.shape)}: {o.not_published}" for o in result.shapes if o.not_published]
        if result.not_published:
            reasons.insert(0, f"{unit.key}: {result.not_published}")
        jobs.record_publication(s, job_id, published, reasons)
    if result.not_published:
        for_job(log, job_id).info("unit %s: not published: %s", unit.key, result.not_published)
    for outcome in result.shapes:
        if outcome.error:
            for_job(log, job_id).warning("shape %s: %s", shape_key(outcome.shape), outcome.error)
        elif outcome.not_published:
            for_job(log, job_id).info("shape %s: not published: %s", shape_key(outcome.shape), outcome.not_published)
    if result.dispatch is not None:
        for_job(log, job_id).info(
            "published a dispatch table over %s with %d artifacts for unit %s",
            result.dispatch.dim,
            len(result.dispatch.artifacts),
            unit.key,
        )


MIN_COMMON_SHAPES = 3  # a verdict between two tables rests on at least this many shapes both measured


def slower_than_current(
    s: Session, workload_hash: str, fingerprint: str, new: DispatchPublication, ratio: float
) -> str | None:
    """Why `new` must not replace the table served now, or None: it covers no more shapes, and where both jobs
    measured their table as the SDK calls it (medians of repeated rounds) it is slower by more than `ratio`
    (geomean). A table that extends the range is published: the shapes it adds have no table at all."""
    current = dispatch_store.latest(s, workload_hash, fingerprint)
    if current is None or current.dim != new.dim or len(new.predicted) > current.s_max:
        return None
    theirs = {int(k): float(v) for k, v in current.measured.items()}
    common = sorted(S for S in new.measured if S in theirs and theirs[S] > 0 and new.measured[S] > 0)
    if len(common) < MIN_COMMON_SHAPES:
        return None
    slower = math.exp(sum(math.log(new.measured[S] / theirs[S]) for S in common) / len(common))
    if slower <= ratio:
        return None
    return (
        f"the table it would replace (job {current.job_id}) is faster where both measured: this one is {slower:.2f}x "
        f"its time over {len(common)} shapes ({new.dim}={common[0]}..{common[-1]}), above the {ratio:.2f}x margin"
    )


def _serves(outcome: ShapeOutcome) -> bool:
    """Whether the outcome's config is published (upserted as the best config for its shape)."""
    return outcome.error is None and outcome.config is not None and outcome.not_published is None


def _publish_shape(s: Session, job_id: str, kind: JobKind, ctx: UnitContext, outcome: ShapeOutcome) -> None:
    if _serves(outcome):
        assert outcome.config_latency_s is not None
        configs.upsert_best(
            s,
            ConfigRecord(
                workload_hash=ctx.workload.workload_hash,
                target_fingerprint=ctx.target.fingerprint,
                shape=outcome.shape,
                latency_s=outcome.config_latency_s,
                kind=kind.name,
                config=outcome.config,
                job_id=job_id,
                provenance={
                    **outcome.provenance,
                    "worker": ctx.worker,
                    "toolchain": ctx.target.toolchain.model_dump() if ctx.target.toolchain else None,
                },
            ),
        )
    jobs.update_shape(
        s,
        job_id,
        shape_key(outcome.shape),
        state=(JobState.succeeded if outcome.error is None else JobState.failed).value,
        best_latency_s=outcome.latency_s if outcome.error is None else None,
        baseline=outcome.vendor.label if outcome.vendor else None,
        baseline_latency_s=outcome.vendor.seconds if outcome.vendor else None,
    )
