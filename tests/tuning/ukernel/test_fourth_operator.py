"""A fourth operator family plugs into `ukernel` jobs and the SDK by adding one module per layer (issue 37 item 3):
tests/tuning/ukernel/row_scale_operator.py (the service) and tests/clients/row_scale_table.py (the SDK), with no
product module edited. Its table goes one way: the unit's typed variant → its tagged JSON (what the store keeps
and the service signs) → the same variant in the SDK → the dispatcher its family registered."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from kernelfleet.dispatch_cache import DispatchCache, dispatcher_from_doc
from kernelfleet.models import DispatchDoc
from kernelfleet.tables import table_from_json
from service.models import Budget, TargetSpec, WorkloadSpec
from service.models.distribution import Explicit, ShapePoint
from service.tuning.kinds import KINDS
from service.tuning.kinds.base import UnitContext
from tests.clients.row_scale_table import RowScaleDispatcher, RowScaleTable
from tests.tuning.ukernel import row_scale_operator

LLVM = TargetSpec(kind="llvm", mcpu="skylake-avx512", num_cores=2)
DIST = Explicit(points=[ShapePoint(shape={"M": m}, weight=1.0) for m in (4, 16, 40)])
BUDGET = Budget(trials=2, max_shapes=2)


@pytest.fixture
def workload(monkeypatch: pytest.MonkeyPatch) -> WorkloadSpec:
    row_scale_operator.install(monkeypatch)
    return WorkloadSpec(op="row_scale", dims={"N": 8}, symbolic=["M"])


def test_the_ukernel_kind_validates_plans_and_scopes_through_the_families_module(workload: WorkloadSpec) -> None:
    kind = KINDS.get("ukernel")
    assert kind.validate(workload, DIST, LLVM, BUDGET) is None
    static = WorkloadSpec(op="row_scale", dims={"M": 4, "N": 8}, symbolic=[])
    problem = kind.validate(static, DIST, LLVM, BUDGET)
    assert problem is not None and problem.message == "row_scale ranges over M"
    (unit,) = kind.plan(workload, DIST, BUDGET).units
    assert unit.key == "M" and unit.trials == 2
    assert kind.fleet_shapes(workload, {"M=40": 1.0, "M=100": 1.0}, {}) == {"M=40": 1.0}


def test_its_table_goes_one_way_from_the_unit_to_its_dispatcher(workload: WorkloadSpec, tmp_path: Path) -> None:
    kind = KINDS.get("ukernel")
    (unit,) = kind.plan(workload, DIST, BUDGET).units
    none: Any = None  # what this family's unit does not use
    ctx = UnitContext("j", "w", workload, LLVM, none, DIST, BUDGET, none, tmp_path, none)
    publication = kind.run_unit(unit, ctx).dispatch
    assert publication is not None and publication.table == RowScaleTable(40, row_scale_operator.FACTOR)

    stored = publication.table.to_json()  # what job_runner hands the store, and the API serves and signs
    assert stored == {"s_max": 40, "factor": 2.0, "kind": "row_scale"}
    doc = DispatchDoc(
        workload_hash="ab" * 8,
        target_fingerprint="cd" * 8,
        dim=publication.dim,
        s_max=len(publication.predicted),
        table=stored,
        ukernels=[],
        predicted_latency_s=publication.predicted,
        measured_latency_s={},
        created_at=dt.datetime.now(dt.UTC),
    )
    assert table_from_json(DispatchDoc.model_validate_json(doc.model_dump_json()).table) == publication.table
    d = cast(RowScaleDispatcher, dispatcher_from_doc(doc, DispatchCache(tmp_path), "service"))
    assert isinstance(d, RowScaleDispatcher) and d.table == publication.table and d.source == "service"
    np.testing.assert_array_equal(d(np.ones((3, 8), np.float32)), np.full((3, 8), 2.0, np.float32))
