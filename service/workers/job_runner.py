"""Runs one tuning job end to end against the store. Free of Celery: the task only calls `run_job`.

A job is resumable: its shape plan and each finished shape are persisted, so a job redelivered
after a worker died continues with the shapes it had not finished.
"""

from __future__ import annotations

import logging
import math
import tempfile
import threading
import traceback
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from pydantic import TypeAdapter

from kernelfleet.tvm_kernel import build_kernel, median_seconds
from service.logs import for_job
from service.models import ConfigRecord, JobState, TargetSpec, WorkloadSpec, shape_key
from service.models.config import MeasuredCandidate
from service.models.distribution import ShapeDistribution
from service.settings import Settings
from service.store import catalog, configs, jobs
from service.store.db import session_scope
from service.workers import baseline, hardware, planning
from service.workers.range_job import run_range
from service.workers.tuners.base import Tuner, TuningStopped, TuningTask
from service.workers.tuners.compute import random_inputs, reference, tolerance
from service.workers.tuners.ukernel.tuner import UKernelTuner

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
    """Streams measured candidates of one shape into the store and counts progress."""

    def __init__(self, job_id: str, workload_hash: str, fingerprint: str, shape: dict[str, int], hb: Heartbeat):
        self.job_id, self.workload_hash, self.fingerprint, self.shape, self.hb = (
            job_id,
            workload_hash,
            fingerprint,
            shape,
            hb,
        )

    def on_candidates(self, candidates: list[MeasuredCandidate]) -> None:
        with session_scope() as s:
            configs.record_candidates(s, self.job_id, self.workload_hash, self.fingerprint, self.shape, candidates)
            jobs.add_progress(s, self.job_id, shape_key(self.shape), len(candidates))

    def should_stop(self) -> bool:
        return self.hb.lost.is_set()


def _verify(config: Mapping[str, object], workload: WorkloadSpec, shape: dict[str, int]) -> tuple[str | None, float]:
    """Rebuild the config exactly as the SDK will, compare it with numpy, and time it as the SDK calls it
    (Python call included, like the vendor baseline): (the error or None, seconds per call)."""
    kernel = build_kernel(config)
    inputs = random_inputs(workload, shape, seed=1)
    err = float(np.abs(kernel(*inputs) - reference(workload)(*inputs)).max())
    limit = tolerance(workload, shape)
    if not err <= limit:
        return f"tuned kernel disagrees with numpy: max abs error {err:.3g} > {limit:.3g}", math.inf
    return None, float(median_seconds(kernel, *inputs))


Tuners = Mapping[str, Tuner | UKernelTuner]


def run_job(job_id: str, worker: str, settings: Settings, tuners: Tuners) -> str:
    """Claim and run a job; returns what happened: succeeded, failed, cancelled, lost-lease, busy (another live
    worker runs it) or skipped (nothing left to do)."""
    with session_scope() as s:
        lease = jobs.claim(s, job_id, worker, settings.stale_after_s)
        if lease is None:
            row = jobs.get_row(s, job_id)
            # 'busy': a live worker owns it; the caller keeps a message around in case that worker dies
            return "busy" if row is not None and row.state == JobState.running.value else "skipped"
    with Heartbeat(job_id, lease, settings.heartbeat_interval_s) as hb:
        try:
            return _run_claimed(job_id, lease, worker, hb, settings, tuners)
        except TuningStopped:
            return _stopped(job_id)
        except Exception as exc:
            for_job(log, job_id).exception("job failed")
            detail = "".join(traceback.format_exception_only(exc)).strip()
            with session_scope() as s:
                jobs.finish(s, job_id, lease, JobState.failed, f"{type(exc).__name__}: {detail}")
            return "failed"


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


def _run_claimed(job_id: str, lease: str, worker: str, hb: Heartbeat, settings: Settings, tuners: Tuners) -> str:
    with session_scope() as s:
        row = jobs.get_row(s, job_id)
        assert row is not None
        workload = catalog.get_workload(s, row.workload_hash)
        kind, target, budget, dist = row.kind, TargetSpec(**row.target), row.budget, row.distribution
    if workload is None:
        return _fail(job_id, lease, f"workload {row.workload_hash} is not registered")
    tuner = tuners.get(kind)
    if tuner is None:
        return _fail(job_id, lease, f"this worker has no tuner for job kind {kind!r}")
    problem = hardware.mismatch(target)
    if problem:
        return _fail(job_id, lease, problem)
    local = hardware.toolchain()
    if target.toolchain is not None and target.toolchain != local:
        return _fail(job_id, lease, f"job asks for toolchain {target.toolchain}, this worker has {local}")
    target = target.with_toolchain(local)
    fingerprint = target.fingerprint
    distribution = TypeAdapter(ShapeDistribution).validate_python(dist)
    if isinstance(tuner, UKernelTuner):
        return run_range(job_id, lease, worker, hb.lost, settings, tuner, workload, target, distribution, budget)
    planned = planning.plan(workload, distribution, budget["trials"], budget["max_shapes"])
    with session_scope() as s:
        catalog.put_target(s, target)
        jobs.resolve_target(s, job_id, fingerprint)
        shape_rows = jobs.plan_shapes(s, job_id, planned)
        todo = [(r.shape_key, dict(r.shape), r.trials) for r in shape_rows if r.state != JobState.succeeded.value]
        jobs.reset_unfinished_progress(s, job_id)

    for key, shape, trials in todo:
        if hb.lost.is_set():
            raise TuningStopped("stopped by the job")
        with session_scope() as s:
            jobs.update_shape(s, job_id, key, state=JobState.running.value, trials_done=0)
        sink = _StoreSink(job_id, workload.workload_hash, fingerprint, shape, hb)
        with tempfile.TemporaryDirectory(prefix=f"kf-{job_id[:8]}-") as tmp:
            task = TuningTask(
                workload,
                shape,
                target,
                trials,
                Path(tmp),
                seed=budget.get("seed"),
                measure_timeout_s=settings.measure_timeout_s,
            )
            outcome = tuner.tune(task, sink)
        error, sdk_seconds = None, math.inf
        vendor = baseline.measure_vendor(workload, shape)
        if outcome.best_config is not None and outcome.best_latency_s is not None:
            error, sdk_seconds = _verify(outcome.best_config, workload, shape)
            # Serve a config only where it beats the vendor as an inference host calls both: a tiny kernel can
            # win in TVM's timing loop and still lose to numpy once Python and thread wake-up are paid.
            slower = error is None and settings.publish_only_faster_than_vendor and sdk_seconds >= vendor
            if slower:
                for_job(log, job_id).info(
                    "shape %s: not published, vendor faster as called (%.1f µs vs %.1f µs)",
                    key,
                    vendor * 1e6,
                    sdk_seconds * 1e6,
                )
            if error is None and not slower:
                with session_scope() as s:
                    configs.upsert_best(
                        s,
                        ConfigRecord(
                            workload_hash=workload.workload_hash,
                            target_fingerprint=fingerprint,
                            shape=shape,
                            latency_s=outcome.best_latency_s,
                            kind=kind,
                            config=outcome.best_config,
                            job_id=job_id,
                            provenance={
                                "tuner": tuner.name,
                                "trials": outcome.measured,
                                "worker": worker,
                                "toolchain": local.model_dump(),
                            },
                        ),
                    )
        else:
            error = f"all {outcome.measured} candidates failed"
        with session_scope() as s:
            jobs.update_shape(
                s,
                job_id,
                key,
                state=(JobState.succeeded if error is None else JobState.failed).value,
                # as the SDK calls it, like the baseline next to it (TVM's own timing leaves out the call)
                best_latency_s=sdk_seconds if error is None else None,
                baseline=baseline.vendor_label(),
                baseline_latency_s=vendor,
            )
        if error:
            for_job(log, job_id).warning("shape %s: %s", key, error)
    with session_scope() as s:
        # counted from the store, so shapes finished by an earlier attempt of a resumed job count too
        if not jobs.count_shapes(s, job_id, JobState.succeeded):
            jobs.finish(s, job_id, lease, JobState.failed, "no shape produced a verified config")
            return "failed"
        jobs.finish(s, job_id, lease, JobState.succeeded)
    return "succeeded"
