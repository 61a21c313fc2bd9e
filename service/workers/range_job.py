"""Runs a `ukernel` job: one tuning for the whole range of M, verified, signed and published as a
dispatch table. Free of Celery; `job_runner` calls it after claiming the job.

Unlike a `sketch` job (one search per hot shape), this job tunes the range once. Its per-shape plan
holds the hot shapes it validates: each is measured, with every uKernel alone and with the program
the table chose, and compared with the vendor baseline, so the job reports speedups per shape.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kernelfleet.dispatcher import Dispatcher
from service.logs import for_job
from service.models import JobState, TargetSpec, Workload, WorkloadSpec, shape_key
from service.models.distribution import ShapeDistribution
from service.settings import Settings
from service.store import catalog, jobs
from service.store import dispatch as dispatch_store
from service.store.db import session_scope
from service.store.jobs import PlannedShape
from service.workers import baseline, planning
from service.workers.tuners.base import TuningStopped
from service.workers.tuners.compute import random_inputs, reference, tolerance
from service.workers.tuners.ukernel.tuner import MAX_UKERNELS, RangeOutcome, RangeTask, UKernelTuner

log = logging.getLogger(__name__)
DIM = "M"


class _ProgressSink:
    """A validated shape counts as fully done: its planned trials are one per uKernel plus the program,
    and uKernels the rules proposed but no program uses are not measured there."""

    def __init__(self, job_id: str, lost: threading.Event, trials_per_shape: int) -> None:
        self.job_id, self.lost, self.trials_per_shape = job_id, lost, trials_per_shape

    def on_validated(self, S: int, measured: int) -> None:
        with session_scope() as s:
            jobs.add_progress(s, self.job_id, shape_key({DIM: S}), self.trials_per_shape)

    def should_stop(self) -> bool:
        return self.lost.is_set()


def _next_prime(n: int) -> int:
    while n < 2 or any(n % d == 0 for d in range(2, int(n**0.5) + 1)):
        n += 1
    return n


def verification_shapes(outcome: RangeOutcome) -> list[int]:
    """Every S up to 256, both ends of every interval (so every program shape runs), and primes past the
    tuned range (where the table extends its last interval)."""
    s_max = outcome.table.s_max
    shapes = set(range(1, min(s_max, 256) + 1))
    for iv in outcome.table.intervals:
        shapes |= {iv.lo, iv.hi}
    shapes |= {_next_prime(s_max + 1), _next_prime(2 * s_max + 1)}
    return sorted(shapes)


def verify(outcome: RangeOutcome, workload: WorkloadSpec) -> str | None:
    """Run the dispatcher exactly as the SDK will and compare with numpy; the first error, or None."""
    N, K = workload.dims["N"], workload.dims["K"]
    dispatcher = Dispatcher(outcome.table, outcome.kernels, N=N, K=K)
    x_all, w = random_inputs(workload, {DIM: max(verification_shapes(outcome))}, seed=1)
    for S in verification_shapes(outcome):
        x = x_all[:S]
        err = float(np.abs(dispatcher(x, w) - reference(workload)(x, w)).max())
        limit = tolerance(workload, {DIM: S})
        if not err <= limit:
            return f"program for {DIM}={S} disagrees with numpy: max abs error {err:.3g} > {limit:.3g}"
    return None


def artifacts_of(outcome: RangeOutcome) -> list[dispatch_store.NewArtifact]:
    """The outcome's libraries, read while its work dir exists."""
    return [
        dispatch_store.NewArtifact(ukernel_id=uid, sha256=a.sha256, spec=a.spec.to_dict(), data=a.path.read_bytes())
        for uid, a in outcome.artifacts.items()
    ]


def validation_record(outcome: RangeOutcome, worker: str) -> dict[str, Any]:
    """What is stored with a table about how it was chosen and how well the models ranked."""
    return {
        **outcome.validation,
        "tuning_seconds": outcome.seconds,
        "padding_ratio": outcome.padding_ratio,
        "candidates": outcome.candidates,
        "hardware": outcome.hardware,
        "worker": worker,
    }


def run_range(
    job_id: str,
    lease: str,
    worker: str,
    lost: threading.Event,
    settings: Settings,
    tuner: UKernelTuner,
    workload: Workload,
    target: TargetSpec,
    distribution: ShapeDistribution,
    budget: Mapping[str, Any],
) -> str:
    fingerprint = target.fingerprint
    hot = planning.hot_shapes(workload, distribution, budget["max_shapes"])
    n_ukernels = min(int(budget["trials"]), MAX_UKERNELS)
    planned = [PlannedShape(shape=s, weight=w, priority=p, trials=n_ukernels + 1) for s, w, p in hot]
    support = distribution.support()
    s_max = max(shape[DIM] for shape, _ in support)
    total = sum(w for _, w in support)
    representative = max(1, round(sum(shape[DIM] * w for shape, w in support) / total))
    with session_scope() as s:
        catalog.put_target(s, target)
        jobs.resolve_target(s, job_id, fingerprint)
        jobs.plan_shapes(s, job_id, planned)
        jobs.reset_unfinished_progress(s, job_id)

    with tempfile.TemporaryDirectory(prefix=f"kf-{job_id[:8]}-") as tmp:
        task = RangeTask(
            workload=workload,
            s_max=s_max,
            validate=[shape[DIM] for shape, _, _ in hot],
            target=target,
            max_ukernels=n_ukernels,
            work_dir=Path(tmp),
            representative_m=representative,
        )
        outcome = tuner.tune_range(task, _ProgressSink(job_id, lost, n_ukernels + 1))
        if lost.is_set():
            raise TuningStopped("stopped by the job")
        error = verify(outcome, workload)
        if error:
            with session_scope() as s:
                jobs.finish(s, job_id, lease, JobState.failed, error)
            return "failed"
        artifacts = artifacts_of(outcome)
    validation = validation_record(outcome, worker)
    vendor = {shape_key(shape): baseline.measure_vendor(workload, shape) for shape, _, _ in hot}
    # Publish, per-shape results and the job's end in one transaction, and only while this worker still
    # holds the lease: a cancelled or taken-over job publishes nothing.
    with session_scope() as s:
        if lost.is_set() or not jobs.heartbeat(s, job_id, lease):
            raise TuningStopped("stopped by the job")
        dispatch_store.publish(
            s,
            workload_hash=workload.workload_hash,
            target_fingerprint=fingerprint,
            dim=DIM,
            table=outcome.table.to_dict(),
            artifacts=artifacts,
            predicted=outcome.predicted_s,
            measured=outcome.measured_s,
            validation=validation,
            job_id=job_id,
        )
        for shape, _, _ in hot:
            jobs.update_shape(
                s,
                job_id,
                shape_key(shape),
                state=JobState.succeeded.value,
                best_latency_s=outcome.measured_s.get(shape[DIM]),
                baseline=baseline.vendor_label(),
                baseline_latency_s=vendor[shape_key(shape)],
            )
        jobs.finish(s, job_id, lease, JobState.succeeded)
    for_job(log, job_id).info(
        "published a dispatch table for %s=1..%d with %d uKernels in %.1f s",
        DIM,
        s_max,
        len(artifacts),
        outcome.seconds,
    )
    return "succeeded"
