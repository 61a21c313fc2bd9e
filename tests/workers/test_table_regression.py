"""A new dispatch table never replaces a faster one (issue 35 item 3), on real SQLite and PostgreSQL."""

from __future__ import annotations

from service.models import TargetSpec, WorkloadSpec
from service.store import catalog
from service.store import dispatch as dispatch_store
from service.store.db import session_scope
from service.tuning.kinds import DispatchPublication
from service.workers.job_runner import slower_than_current

TARGET = TargetSpec.model_validate({"kind": "llvm", "mcpu": "znver4", "num_cores": 2, "toolchain": {"tvm": "0.27.0"}})
W = WorkloadSpec(op="dense", dims={"N": 64, "K": 32}, symbolic=["M"])


def _table(s_max: int, measured: dict[int, float]) -> DispatchPublication:
    return DispatchPublication("M", {"intervals": []}, [], [1e-5] * s_max, measured, {})


def test_a_table_slower_where_both_measured_is_held_back_unless_it_covers_more(use_store: str) -> None:
    with session_scope() as s:
        wh, fp = catalog.put_workload(s, W).workload_hash, catalog.put_target(s, TARGET).target_fingerprint
        assert slower_than_current(s, wh, fp, _table(64, {1: 1.0, 8: 1.0, 64: 1.0}), 1.1) is None  # nothing served yet
        old = _table(64, {1: 1e-5, 8: 2e-5, 32: 4e-5, 64: 8e-5})
        dispatch_store.publish(
            s, workload_hash=wh, target_fingerprint=fp, dim="M", table=old.table, artifacts=[],
            predicted=old.predicted, measured=old.measured, validation={}, job_id="old-job",
        )  # fmt: skip
        slower = _table(64, {1: 1.2e-5, 8: 2.4e-5, 64: 9.6e-5, 48: 1.0})  # 1.2x at the three shapes both measured
        why = slower_than_current(s, wh, fp, slower, 1.1)
        assert why is not None and "job old-job" in why and "1.20x" in why and "3 shapes (M=1..64)" in why
        assert slower_than_current(s, wh, fp, slower, 1.25) is None  # within the margin
        assert slower_than_current(s, wh, fp, _table(64, {1: 0.9e-5, 8: 1.8e-5, 64: 7e-5}), 1.1) is None  # faster
        assert slower_than_current(s, wh, fp, _table(128, {1: 1.0, 8: 1.0, 64: 1.0}), 1.1) is None  # covers more
        assert slower_than_current(s, wh, fp, _table(64, {1: 1.0, 8: 1.0}), 1.1) is None  # too few shapes to judge
