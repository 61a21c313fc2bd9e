"""A test-only fourth operator family for the service: its operator definition (the models layer) and how
`ukernel` jobs tune it (the tuning layer), publishing the SDK variant of tests/clients/row_scale_table.py. Nothing
in a product module names it: `install` registers it, as a plugin would."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from service.models import TargetSpec, WorkloadSpec, shape_key
from service.models.distribution import ShapeDistribution
from service.models.operators import OPERATORS, OperatorDef, TensorDef
from service.models.plan import PlannedShape
from service.tuning import planning
from service.tuning.kinds.base import DispatchPublication, Plan, Problem, UnitContext, UnitResult, WorkUnit
from service.tuning.kinds.ukernel_ops import UKERNEL_OPERATORS, UKernelOperator
from tests.clients.row_scale_table import RowScaleTable

ROW_SCALE = OperatorDef(
    name="row_scale",
    description="Y[M,N] = X[M,N] · factor",
    dims=("M", "N"),
    inputs=(TensorDef("X", ("M", "N")),),
    output=TensorDef("Y", ("M", "N")),
    flops=lambda s, a: s["M"] * s["N"],
)
FACTOR = 2.0  # what the "tuning" finds


def validate(workload: WorkloadSpec, distribution: ShapeDistribution, target: TargetSpec) -> Problem | None:
    return None if workload.symbolic == ["M"] else Problem(("workload", "symbolic"), "row_scale ranges over M")


def plan(workload: WorkloadSpec, distribution: ShapeDistribution, max_shapes: int, ukernels: int) -> Plan:
    hot = planning.hot_shapes(workload, distribution, max_shapes)
    shapes = [PlannedShape(shape=s, weight=w, priority=p, trials=1) for s, w, p in hot]
    unit = WorkUnit("M", tuple(shape_key(p.shape) for p in shapes), ukernels)
    return Plan(shapes=shapes, units=[unit], trials_total=unit.trials)


def run_unit(unit: WorkUnit, ctx: UnitContext, hot: list[PlannedShape]) -> UnitResult:
    s_max = max(shape["M"] for shape, _ in ctx.distribution.support())
    table = RowScaleTable(s_max, FACTOR)
    return UnitResult(dispatch=DispatchPublication("M", table, [], [1e-6] * s_max, {}, {}))


def in_scope(workload: WorkloadSpec, shape: Mapping[str, int]) -> bool:
    return shape["M"] <= 64


OPERATOR = UKernelOperator("row_scale", validate, plan, run_unit, in_scope)


def install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plug the family in: its operator definition for this test only, its ukernel operator once."""
    monkeypatch.setitem(OPERATORS, ROW_SCALE.name, ROW_SCALE)
    UKERNEL_OPERATORS.register(OPERATOR.op, OPERATOR)
