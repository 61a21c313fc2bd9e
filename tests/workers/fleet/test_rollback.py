"""Tables rolled back on production telemetry (issue 35 item 3), on real SQLite and PostgreSQL: the hosts' A/B
holdout goes in through telemetry ingestion, the daily run's check retires a table slower than the hosts' baseline or
than the table it replaced, beyond the interval and the margin, and hosts get the previous table back; a table whose
difference is inside the margin stays."""

from __future__ import annotations

import datetime as dt
import uuid

import numpy as np

from service.models.fleet import TelemetryBatch
from service.store import dispatch as dispatch_store
from service.store import fleet as fleet_store
from service.store.db import session_scope
from service.workers.fleet.rollback import check_tables

WH, FP = "ab" * 16, "cd" * 16
DAY = dt.date(2026, 11, 20)
MARGIN = 0.03


def _publish(job: str) -> int:
    with session_scope() as s:
        row = dispatch_store.publish(session=s, workload_hash=WH, target_fingerprint=FP, dim="M", table={},
                                     artifacts=[], predicted=[1e-5] * 64, measured={}, validation={},
                                     job_id=job)  # fmt: skip
        return row.id


def _report(job: str, served_mean: float, baseline_mean: float, day: dt.date = DAY, seed: int = 0) -> None:
    """A host's day at M = 8 and 32: 200 served calls and 20 held out per shape, timings spread 20 %."""
    rng = np.random.default_rng(seed)
    records = []
    for m in (8, 32):
        served = served_mean * m * rng.lognormal(0, 0.2, 200)
        base = baseline_mean * m * rng.lognormal(0, 0.2, 20)
        records.append({
            "workload_hash": WH, "target_fingerprint": FP, "shape": {"M": m}, "calls": 220,
            "kernel_seconds": float(served.sum() + base.sum()), "day": day.isoformat(), "table_job_id": job,
            "holdout": {"baseline": "torch", "served_calls": 200, "served_s": float(served.sum()),
                        "served_s2": float((served**2).sum()), "baseline_calls": 20,
                        "baseline_s": float(base.sum()), "baseline_s2": float((base**2).sum())},
        })  # fmt: skip
    batch = TelemetryBatch.model_validate({"batch_id": str(uuid.uuid4()), "host": "h", "records": records})
    with session_scope() as s:
        assert fleet_store.ingest(s, batch, None, day)


def _check() -> list:  # type: ignore[type-arg]
    with session_scope() as s:
        return check_tables(s, DAY, DAY, MARGIN)


def _served_job() -> str | None:
    with session_scope() as s:
        row = dispatch_store.latest(s, WH, FP)
        return row.job_id if row is not None else None


def test_a_table_slower_than_the_hosts_baseline_is_rolled_back_to_the_one_before(use_store: str) -> None:
    _publish("job-old")
    _publish("job-new")
    _report("job-new", served_mean=1.3e-6, baseline_mean=1.0e-6)  # 1.3x the baseline's time
    [rollback] = _check()
    assert rollback.against == "baseline" and rollback.table_job_id == "job-new"
    assert rollback.now_serving == "job-old" and rollback.shapes == 2
    assert rollback.slowdown_s - rollback.ci95_s > 0 and rollback.served_s / rollback.other_s > 1.2
    assert _served_job() == "job-old"
    with session_scope() as s:
        retired = [r for r in dispatch_store.latest_per_key(s, WH, FP, 10)]
        assert [r.job_id for r in retired] == ["job-old"]  # the listing serves what hosts get
        # the ranking reads this: a task rolled back inside the window is not tuned again the same way meanwhile
        assert dispatch_store.retired_since(s, WH, FP, dt.datetime.combine(DAY, dt.time(), tzinfo=dt.UTC))
        assert not dispatch_store.retired_since(s, WH, FP, dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    assert _check() == []  # job-new's telemetry is of a table no longer served: nothing more to do


def test_a_table_slower_than_the_table_it_replaced_is_rolled_back(use_store: str) -> None:
    _publish("job-old")
    _report("job-old", served_mean=0.5e-6, baseline_mean=1.0e-6, day=DAY - dt.timedelta(days=3), seed=1)
    _publish("job-new")
    _report("job-new", served_mean=0.8e-6, baseline_mean=1.0e-6, seed=2)  # faster than the baseline, not than old
    [rollback] = _check()
    assert rollback.against == "previous table" and rollback.other_job_id == "job-old"
    assert _served_job() == "job-old"


def test_a_slower_day_is_not_a_slower_table(use_store: str) -> None:
    """Day 2 runs everything 1.5x slower (load, clocks): the new table keeps the old one's ratio to that day's
    baseline, so it stays; raw served times across days would have read 1.5x slower and rolled it back."""
    _publish("job-old")
    _report("job-old", served_mean=0.5e-6, baseline_mean=1.0e-6, day=DAY - dt.timedelta(days=1), seed=5)
    _publish("job-new")
    _report("job-new", served_mean=0.75e-6, baseline_mean=1.5e-6, seed=6)
    assert _check() == [] and _served_job() == "job-new"


def test_a_faster_table_stays(use_store: str) -> None:
    _publish("job-a")
    _report("job-a", served_mean=0.7e-6, baseline_mean=1.0e-6)
    assert _check() == [] and _served_job() == "job-a"


def test_a_difference_within_the_margin_stays(use_store: str) -> None:
    _publish("job-a")
    _report("job-a", served_mean=1.0e-6, baseline_mean=1.0e-6, day=DAY - dt.timedelta(days=1), seed=4)
    _publish("job-b")
    _report("job-b", served_mean=1.01e-6, baseline_mean=1.0e-6, seed=3)  # 1 % slower than both: inside the margin
    assert _check() == [] and _served_job() == "job-b"


def test_the_only_table_rolled_back_leaves_the_hosts_their_baseline(use_store: str) -> None:
    _publish("job-only")
    _report("job-only", served_mean=2e-6, baseline_mean=1e-6)
    [rollback] = _check()
    assert rollback.now_serving is None and _served_job() is None
