"""`ukernel` jobs: FTuner/DietCode micro-kernels for a whole dynamic range, published as a dispatch table.

Unlike a `sketch` job (one search per hot shape), the job tunes the range M = 1..S_max once, as one
unit. Its shape rows are the hot shapes it validates: each is measured with every uKernel alone and with
the program the table chose, next to the vendor library, so the job reports speedups per shape. The
table routes every S where a vendor library (numpy, or PyTorch) is faster as the SDK calls them to that library
(the tuner times them on a geometric grid of S and the hot shapes, bisects every crossing to the exact S and,
between points that agree, measures where its calibrated cost model doubts the winner:
`tuners.ukernel.vendor_routes`); a table that would route every S to the library its hosts already run (the
`host_library` tag: numpy unless the job says PyTorch, kinds/host_library.py) is not published, and the job says
so (`published: false` with the reason). Before anything is published the SDK dispatcher
runs every S ≤ 256, both ends of every interval and two primes past S_max against the reference.

A layer's bias and activation (dense attrs) are fused into every uKernel on CPU targets, and the vendor side
of every timing runs them too (numpy, as a host would); CUDA uKernels do not fuse them yet.

Each operator family is one module that says how it validates, plans and runs its unit (kinds/ukernel_ops.py):
dense layers in kinds/ukernel_dense.py, batch_matmul (several dynamic dims, a tuple table) in kinds/ukernel_bmm.py,
conv2d (NHWC, an implicit GEMM over M = N·OH·OW through the same range unit, kinds/ukernel_range.py) in
kinds/ukernel_conv.py. The kind itself branches on no op.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel

from service.models import Budget, TargetSpec, WorkloadSpec
from service.models.config import UKernelTileConfig
from service.models.distribution import ShapeDistribution
from service.tuning.kinds.base import (
    JobKind,
    Plan,
    Problem,
    UnitContext,
    UnitResult,
    WorkUnit,
)
from service.tuning.kinds.host_library import check_host_library
from service.tuning.kinds.ukernel_ops import UKERNEL_OPERATORS, UKernelOperator
from service.tuning.kinds.ukernel_range import DIM, artifacts_of, validation_record, verification_shapes, verify
from service.tuning.tuners.ukernel.bounds import MAX_UKERNELS

# what tests, benches and the other ukernel paths have always imported from here
__all__ = ["DIM", "UKernelKind", "artifacts_of", "validation_record", "verification_shapes", "verify"]


class UKernelKind(JobKind):
    name = "ukernel"
    summary = "FTuner/DietCode uKernels over a symbolic M, combined per shape into one dispatch table for M = 1..S_max"
    target_kinds: ClassVar[frozenset[str]] = frozenset({"llvm", "cuda"})
    dtypes: ClassVar[frozenset[str]] = frozenset({"float32", "float16", "bfloat16"})  # per family: validate
    publishes = "dispatch"
    default_trials = MAX_UKERNELS
    fleet_priority = 20
    saturates_after = 1  # one job tunes the whole range: more budget buys nothing
    config_schema: ClassVar[type[BaseModel] | None] = UKernelTileConfig  # its candidates' configs

    def validate(
        self, workload: WorkloadSpec, distribution: ShapeDistribution, target: TargetSpec, budget: Budget
    ) -> Problem | None:
        if workload.op not in UKERNEL_OPERATORS.names():
            return Problem(("workload",), f"ukernel jobs tune the ops {', '.join(UKERNEL_OPERATORS.names())}")
        return UKERNEL_OPERATORS.get(workload.op).validate(workload, distribution, target)

    def check_tags(self, tags: Mapping[str, str]) -> Problem | None:
        return check_host_library(tags)

    def plan(self, workload: WorkloadSpec, distribution: ShapeDistribution, budget: Budget) -> Plan:
        return _operator(workload).plan(
            workload, distribution, budget.max_shapes, min(int(budget.trials), MAX_UKERNELS)
        )

    def run_unit(self, unit: WorkUnit, ctx: UnitContext) -> UnitResult:
        hot = self.plan(ctx.workload, ctx.distribution, ctx.budget).shapes
        return _operator(ctx.workload).run_unit(unit, ctx, hot)

    # -- the fleet loop ------------------------------------------------------------------------------
    def fleet_trials(self, units: int, unit_trials: int) -> int:
        return MAX_UKERNELS  # a ukernel job's "trials" are the uKernels it builds

    def fleet_shapes(
        self, workload: WorkloadSpec, observed: Mapping[str, float], candidates: Mapping[str, float]
    ) -> dict[str, float]:
        # the whole observed range, up to what a job can tune (larger ones run on the table's last interval or class)
        from service.models.shape import parse_shape_key

        in_scope = _operator(workload).in_scope
        return {k: w for k, w in observed.items() if in_scope(workload, parse_shape_key(k))}

    def describe_config(self, config: Mapping[str, Any]) -> str:
        tile = "×".join(str(t) for t in config.get("tile", []))
        measured = config.get("measured") or {}
        sampled = ", ".join(sorted(measured, key=int))
        return f"{config.get('id', '?')} tile {tile}, score {config.get('score', 0):.3g}; timed at M = {sampled}"


def _operator(workload: WorkloadSpec) -> UKernelOperator:
    return UKERNEL_OPERATORS.get(workload.op)  # KeyError for an op validate refuses


# -- the dashboard ----------------------------------------------------------------------------------------
