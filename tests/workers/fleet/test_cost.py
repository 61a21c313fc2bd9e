"""What the daily report says earlier fleet runs cost (issue 35 item 2), on real SQLite and PostgreSQL: every job that
ran costs its worker time (failed, cancelled, superseded, retried, still running); the modelled saving (never called
measured) comes from each task's newest succeeded job only."""

from __future__ import annotations

import datetime as dt

import pytest

from service.models import Budget, JobSpec, TargetSpec, WorkloadSpec
from service.models.distribution import Explicit, ShapePoint
from service.store import catalog, jobs
from service.store.db import session_scope
from service.store.tables import JobShapeRow
from service.workers.fleet.daily import _cost, _fleet_jobs, _modelled, _seconds_per_unit

W = WorkloadSpec(op="dense", dims={"N": 32, "K": 32}, symbolic=["M"])
TARGET = TargetSpec.model_validate({"kind": "llvm", "mcpu": "znver4", "num_cores": 2, "toolchain": {"tvm": "0.27.0"}})
DAY = dt.date(2026, 11, 20)
T0 = dt.datetime(2026, 11, 19, 3, 0, tzinfo=dt.UTC)


def _job(
    state: str, seconds: float | None, run_day: dt.date, speedup: float | None = None, hour: int = 0, units: int = 1
) -> str:
    tags = {"fleet_run": run_day.isoformat(), "fleet_target": "fp", "fleet_units": str(units)}
    spec = JobSpec(kind="sketch", workload=W, target=TARGET, distribution=Explicit(points=[ShapePoint(shape={"M": 8})]),
                   budget=Budget(trials=8), tags=tags)  # fmt: skip
    with session_scope() as s:
        row = jobs.create_job(s, spec, catalog.put_workload(s, W).workload_hash, queue="cpu.znver4")
        row.created_at = row.started_at = T0 + dt.timedelta(hours=hour)
        row.state = state
        row.finished_at = None if seconds is None else row.started_at + dt.timedelta(seconds=seconds)
        row.cpu_seconds = None if seconds is None else seconds * 1.5  # two cores, partly busy
        if speedup is not None:
            s.add(JobShapeRow(job_id=row.id, shape_key="M=8", shape={"M": 8}, weight=1.0, priority=1.0, trials=8,
                              state="succeeded", best_latency_s=1e-5, baseline_latency_s=1e-5 * speedup))  # fmt: skip
        return row.id


def test_every_job_an_earlier_run_started_is_counted_and_only_the_newest_success_saves(use_store: str) -> None:
    yesterday = DAY - dt.timedelta(days=1)
    _job("succeeded", 100, yesterday, speedup=1.5, hour=0)  # superseded by the next one
    _job("succeeded", 60, yesterday, speedup=2.0, hour=1)  # the task's newest: what runs now
    _job("failed", 30, yesterday, hour=2)
    _job("cancelled", 5, yesterday, hour=3)
    _job("succeeded", 999, DAY, speedup=9.0, hour=4)  # today's run: not an earlier one
    with session_scope() as s:
        jobs = _fleet_jobs(s, DAY)
        cost, modelled = _cost(jobs), _modelled(s, jobs, {(W.hash, "fp"): 10.0})
    assert cost["tuning_s"] == pytest.approx(195) and cost["cpu_s"] == pytest.approx(195 * 1.5)
    assert cost["cost_by_state"] == pytest.approx({"superseded": 100, "succeeded": 60, "failed": 30,
                                                   "cancelled": 5})  # fmt: skip
    assert cost["jobs_by_state"] == {"superseded": 1, "succeeded": 1, "failed": 1, "cancelled": 1}
    assert modelled == {"jobs": 1, "saved_s_per_day": pytest.approx(10.0)}  # 10 s/day at 2x: 10 modelled


def test_a_job_still_running_costs_its_time_so_far(use_store: str) -> None:
    _job("running", None, DAY - dt.timedelta(days=1))
    with session_scope() as s:
        cost = _cost(_fleet_jobs(s, DAY))
    assert cost["jobs_by_state"] == {"running": 1}
    assert cost["tuning_s"] > 3600  # started a day or more before now


def test_a_unit_costs_the_median_worker_seconds_per_unit_of_finished_fleet_jobs(use_store: str) -> None:
    yesterday = DAY - dt.timedelta(days=1)
    _job("succeeded", 100, yesterday, units=2, hour=0)  # 50 s a unit
    _job("failed", 30, yesterday, units=1, hour=1)  # 30: a failed job's time was spent too
    _job("succeeded", 90, yesterday, units=1, hour=2)  # 90
    _job("running", None, yesterday, units=1, hour=3)  # not finished: says nothing yet
    with session_scope() as s:
        assert _seconds_per_unit(_fleet_jobs(s, DAY), prior=60.0) == {"cpu.znver4": pytest.approx(50.0)}
        assert _seconds_per_unit([], prior=60.0) == {}  # the caller uses the prior per queue
