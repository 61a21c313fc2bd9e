"""The daily run tunes each layer for the library its hosts run (issue 35): on real SQLite and PostgreSQL, the
A/B holdout telemetry says what the hosts hold calls out for, and the layer's fleet job carries it as its
host_library tag (kinds/host_library.py: a table that changes nothing for those hosts is not published)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from service.models import TargetSpec, WorkloadSpec
from service.models.fleet import TelemetryBatch
from service.store import catalog
from service.store import fleet as fleet_store
from service.store.db import session_scope
from service.store.tables import JobRow
from service.workers.fleet.daily import _most_held_out_library

UNTIL = dt.date(2026, 11, 20)
TARGET = TargetSpec.model_validate({"kind": "llvm", "mcpu": "znver4", "num_cores": 2, "toolchain": {"tvm": "0.27.0"}})


def _report(workload: str, fp: str, held_out: dict[str, int]) -> None:
    """One host per baseline at M = 8: 100 calls, `held_out[baseline]` of them run that baseline (none: one host
    that holds nothing out)."""
    records = [
        {"workload_hash": workload, "target_fingerprint": fp, "shape": {"M": 8}, "calls": 100, "kernel_seconds": 1.0,
         "day": UNTIL.isoformat(), "holdout": {"baseline": baseline, "served_calls": 100 - n, "served_s": 0.5,
                                               "served_s2": 0.01, "baseline_calls": n, "baseline_s": 0.5,
                                               "baseline_s2": 0.01}}
        for baseline, n in held_out.items()
    ] or [{"workload_hash": workload, "target_fingerprint": fp, "shape": {"M": 8}, "calls": 100, "kernel_seconds": 1.0,
           "day": UNTIL.isoformat()}]  # fmt: skip
    for record in records:  # one batch per host
        batch = TelemetryBatch.model_validate({"batch_id": str(uuid.uuid4()), "host": "h", "records": [record]})
        with session_scope() as s:
            assert fleet_store.ingest(s, batch, None, UNTIL)


def test_the_library_most_held_out_calls_ran_is_the_hosts_library() -> None:
    assert _most_held_out_library({"torch": 30, "numpy": 10}) == "torch"
    assert _most_held_out_library({"torch": 0, "numpy": 10}) == "numpy"
    assert _most_held_out_library({"numpy": 5, "torch": 5}) == "numpy"  # a tie: the same answer every run
    assert _most_held_out_library({"": 50, "jax": 40}) is None  # unrecorded, or a baseline no vendor route runs


def test_the_daily_run_tags_each_layers_job_with_its_hosts_library(
    use_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.settings import get_settings
    from service.workers.fleet.daily import run_daily

    get_settings.cache_clear()
    with session_scope() as s:
        fp = catalog.put_target(s, TARGET).target_fingerprint
        torch_layer, numpy_layer, quiet_layer = (
            catalog.put_workload(s, WorkloadSpec(op="dense", dims={"N": n, "K": 64}, symbolic=["M"])).workload_hash
            for n in (64, 128, 256)
        )
    _report(torch_layer, fp, {"torch": 10, "numpy": 2})
    _report(numpy_layer, fp, {"numpy": 10})
    _report(quiet_layer, fp, {})  # its hosts hold nothing out: the job says nothing, numpy hosts are assumed
    with session_scope() as s:
        assert fleet_store.host_baselines(s, UNTIL, UNTIL)[(torch_layer, fp)] == {"torch": 10, "numpy": 2}
        assert [h.baseline for h in fleet_store.holdout(s, UNTIL, UNTIL, workload_hash=torch_layer)] == [
            "numpy",
            "torch",
        ]  # never summed across baselines
    report = run_daily(UNTIL + dt.timedelta(days=1), get_settings(), None)
    get_settings.cache_clear()
    assert report is not None and report.state == "done", report and report.error
    with session_scope() as s:
        tags = {row.workload_hash: row.tags for row in s.query(JobRow)}
    assert tags[torch_layer]["host_library"] == "torch" and tags[numpy_layer]["host_library"] == "numpy"
    assert "host_library" not in tags[quiet_layer]


def test_pytorch_hosts_jobs_route_to_pytorch_alone_numpy_hosts_to_any_library() -> None:
    from kernelfleet import vendor
    from service.tuning.kinds.host_library import route_libraries

    assert route_libraries({"host_library": "torch"}) == (("torch",) if vendor.has_torch() else None)
    assert route_libraries({"host_library": "numpy"}) is None and route_libraries({}) is None
