"""Tasks whose hosts stopped reporting (issue 35 item 4), on real SQLite and PostgreSQL: named in the daily report
with their last day, never tuned again from the window's older telemetry, their tables kept."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from service.models import ConfigRecord, TargetSpec, WorkloadSpec
from service.models.fleet import TelemetryBatch
from service.store import catalog, configs
from service.store import fleet as fleet_store
from service.store.db import session_scope
from service.workers.fleet.daily import _silent

UNTIL = dt.date(2026, 11, 20)  # the last day a run on the 21st reads
TARGET = TargetSpec.model_validate({"kind": "llvm", "mcpu": "znver4", "num_cores": 2, "toolchain": {"tvm": "0.27.0"}})


def _report(workload: str, fp: str, day: dt.date) -> None:
    record = {"workload_hash": workload, "target_fingerprint": fp, "shape": {"M": 8}, "calls": 10,
              "kernel_seconds": 1.0, "fallbacks": 0, "day": day.isoformat()}  # fmt: skip
    batch = TelemetryBatch.model_validate({"batch_id": str(uuid.uuid4()), "host": "h", "records": [record]})
    with session_scope() as s:
        fleet_store.ingest(s, batch, None, UNTIL + dt.timedelta(days=1))


def test_silent_tasks_are_named_with_their_last_day_and_whether_they_are_served(use_store: str) -> None:
    spec = {"op": "dense", "symbolic": ["M"]}
    with session_scope() as s:
        fp = catalog.put_target(s, TARGET).target_fingerprint
        live, quiet, gone = (catalog.put_workload(s, WorkloadSpec(**spec, dims={"N": n, "K": 32})).workload_hash
                             for n in (16, 32, 64))  # fmt: skip
        configs.upsert_best(s, ConfigRecord(workload_hash=gone, target_fingerprint=fp, shape={"M": 8}, latency_s=1e-5,
                                            kind="sketch", config={"format": "x"}))  # fmt: skip
    _report(live, fp, UNTIL - dt.timedelta(days=1))  # yesterday but one: still live
    _report(quiet, fp, UNTIL - dt.timedelta(days=3))
    _report(gone, fp, UNTIL - dt.timedelta(days=40))  # long gone, outside any window, still named
    with session_scope() as s:
        silent = _silent(s, UNTIL, after_days=2)
    assert [(t.workload_hash, t.days_silent, t.published, t.rule) for t in silent] == [
        (quiet, 3, False, "kept"),
        (gone, 40, True, "kept"),
    ]
    assert silent[0].label == "dense M=? N=32 K=32" and silent[0].last_seen == UNTIL - dt.timedelta(days=3)


def test_a_silent_task_is_not_ranked_from_the_windows_older_telemetry(
    use_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.settings import get_settings
    from service.workers.fleet.daily import run_daily

    monkeypatch.setenv("KERNELFLEET_FLEET_DAILY_TRIALS", "0")  # rank and report only: nothing submitted
    get_settings.cache_clear()
    with session_scope() as s:
        fp = catalog.put_target(s, TARGET).target_fingerprint
        live, quiet = (catalog.put_workload(s, WorkloadSpec(op="dense", dims={"N": n, "K": 32}, symbolic=["M"]))
                       .workload_hash for n in (16, 32))  # fmt: skip
    _report(live, fp, UNTIL)
    _report(quiet, fp, UNTIL - dt.timedelta(days=3))  # inside the 7-day window, but silent since
    report = run_daily(UNTIL + dt.timedelta(days=1), get_settings(), None)
    get_settings.cache_clear()
    assert report is not None and report.state == "done", report and report.error
    assert [c.workload_hash for c in report.candidates] == [live]
    assert [t.workload_hash for t in report.silent] == [quiet]
