"""The operator families a `ukernel` job tunes, one module each, registered by the op they tune.

`UKernelKind` (kinds/ukernel.py) validates, plans and runs a job through the family of its workload's op, and
keeps nothing per operator itself: a new operator family is one module with a `UKernelOperator`, registered in
`UKERNEL_OPERATORS` (and, in the SDK, the variant of dispatch table it publishes: kernelfleet.tables).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from service.models import TargetSpec, WorkloadSpec
from service.models.distribution import ShapeDistribution
from service.models.plan import PlannedShape
from service.registry import Registry
from service.tuning.kinds.base import Plan, Problem, UnitContext, UnitResult, WorkUnit
from service.tuning.tuners.ukernel.bounds import MAX_S


@dataclass(frozen=True)
class UKernelOperator:
    """How `ukernel` jobs tune one operator family (op)."""

    op: str
    validate: Callable[[WorkloadSpec, ShapeDistribution, TargetSpec], Problem | None]
    # (workload, distribution, max_shapes, uKernels per job) → the job's plan
    plan: Callable[[WorkloadSpec, ShapeDistribution, int, int], Plan]
    # (unit, context, the plan's hot shapes) → the unit's shapes and its dispatch table (or why none)
    run_unit: Callable[[WorkUnit, UnitContext, list[PlannedShape]], UnitResult]
    # (workload, shape) → whether one job can tune up to that shape (the fleet loop's scope)
    in_scope: Callable[[WorkloadSpec, Mapping[str, int]], bool]


# by op, in the project's one registry mechanism (service/registry.py): each built-in family is imported when a job
# of its op first needs it; deployments and tests add theirs with `UKERNEL_OPERATORS.register(op, operator)`
UKERNEL_OPERATORS: Registry[UKernelOperator] = Registry(
    "ukernel operator family",
    {
        "dense": "service.tuning.kinds.ukernel_dense:dense_operator",
        "batch_matmul": "service.tuning.kinds.ukernel_bmm:batch_matmul_operator",
        "conv2d": "service.tuning.kinds.ukernel_conv:conv2d_operator",
    },
)


def every_dim_up_to_max_s(workload: WorkloadSpec, shape: Mapping[str, int]) -> bool:
    """The fleet scope of a family whose dims are tuned as they are: each up to MAX_S (larger ones run on the
    table's last interval or class)."""
    return max(shape.values()) <= MAX_S
