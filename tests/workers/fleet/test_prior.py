"""The gain the daily run expects from tuning a task on a target (issue 35): the hosts' own A/B speedup where
their telemetry measured one, on real SQLite and PostgreSQL, not the worker's comparison with its own vendor
(which, for PyTorch hosts served numpy routes, said 1.0× and stopped the fleet from tuning their other layers)."""

from __future__ import annotations

import datetime as dt
import uuid

import numpy as np
import pytest

from service.models.fleet import TelemetryBatch
from service.store import fleet as fleet_store
from service.store.db import session_scope
from service.workers.fleet.daily import _speedup_prior

DAY = dt.date(2026, 11, 20)
FP, OTHER = "f" * 32, "e" * 32


def _report(fp: str, served_mean: float, baseline_mean: float, table: str | None) -> None:
    rng = np.random.default_rng(0)
    served, base = served_mean * rng.lognormal(0, 0.1, 50), baseline_mean * rng.lognormal(0, 0.1, 50)
    record = {"workload_hash": "a" * 32, "target_fingerprint": fp, "shape": {"M": 8}, "calls": 100,
              "kernel_seconds": float(served.sum() + base.sum()), "day": DAY.isoformat(), "table_job_id": table,
              "holdout": {"baseline": "torch", "served_calls": 50, "served_s": float(served.sum()),
                          "served_s2": float((served**2).sum()), "baseline_calls": 50,
                          "baseline_s": float(base.sum()), "baseline_s2": float((base**2).sum())}}  # fmt: skip
    batch = TelemetryBatch.model_validate({"batch_id": str(uuid.uuid4()), "host": "h", "records": [record]})
    with session_scope() as s:
        assert fleet_store.ingest(s, batch, None, DAY)


def test_the_prior_is_the_hosts_measured_speedup_where_tables_served(use_store: str) -> None:
    _report(FP, served_mean=1e-4, baseline_mean=2e-4, table="job-1")  # a table served at half the baseline's time
    _report(OTHER, served_mean=1e-4, baseline_mean=1e-4, table=None)  # no table: both sides ran the baseline
    with session_scope() as s:
        assert _speedup_prior(s, FP, 1.5, DAY, DAY) == pytest.approx(2.0, rel=0.1)
        assert _speedup_prior(s, OTHER, 1.5, DAY, DAY) == 1.5  # nothing served: no jobs either, the default
        assert _speedup_prior(s, FP, 1.5, DAY + dt.timedelta(days=1), DAY + dt.timedelta(days=2)) == 1.5
