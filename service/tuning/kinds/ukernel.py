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

batch_matmul jobs (several dynamic dims, a tuple table) are in kinds/ukernel_bmm.py; conv2d jobs (NHWC, an
implicit GEMM over M = N·OH·OW through this same range unit, kinds/ukernel_range.py) in kinds/ukernel_conv.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel

from service.models import Budget, TargetSpec, WorkloadSpec, shape_key
from service.models.config import UKernelTileConfig
from service.models.distribution import ShapeDistribution
from service.models.plan import PlannedShape
from service.tuning import planning
from service.tuning.kinds.base import (
    JobKind,
    Plan,
    Problem,
    ShapeOutcome,
    UnitContext,
    UnitResult,
    WorkUnit,
)
from service.tuning.kinds.host_library import check_host_library
from service.tuning.kinds.ukernel_bmm import plan_bmm, run_bmm_unit, validate_bmm
from service.tuning.kinds.ukernel_conv import plan_conv, run_conv_unit, validate_conv
from service.tuning.kinds.ukernel_range import (
    DIM,
    artifacts_of,
    publish_range,
    tune_unit,
    validation_record,
    verification_shapes,
    verify,
)
from service.tuning.tuners.ukernel.bounds import MAX_CONV_M, MAX_S, MAX_UKERNELS

# what tests, benches and the other ukernel paths have always imported from here
__all__ = ["DIM", "UKernelKind", "artifacts_of", "validation_record", "verification_shapes", "verify"]


class UKernelKind(JobKind):
    name = "ukernel"
    summary = "FTuner/DietCode uKernels over a symbolic M, combined per shape into one dispatch table for M = 1..S_max"
    target_kinds: ClassVar[frozenset[str]] = frozenset({"llvm", "cuda"})
    publishes = "dispatch"
    default_trials = MAX_UKERNELS
    fleet_priority = 20
    saturates_after = 1  # one job tunes the whole range: more budget buys nothing
    config_schema: ClassVar[type[BaseModel] | None] = UKernelTileConfig  # its candidates' configs

    def validate(
        self, workload: WorkloadSpec, distribution: ShapeDistribution, target: TargetSpec, budget: Budget
    ) -> Problem | None:
        if workload.op == "batch_matmul":
            return validate_bmm(workload, distribution, target)
        if workload.op == "conv2d":
            return validate_conv(workload, distribution, target)
        if workload.op != "dense":
            return Problem(("workload",), "ukernel jobs tune dense layers (op 'dense'), batch_matmul and conv2d")
        if target.kind == "cuda" and (workload.attrs.get("bias") or workload.attrs.get("activation", "none") != "none"):
            return Problem(("workload", "attrs"), "CPU targets fuse bias and activation; CUDA uKernels do not yet")
        if workload.symbolic != [DIM]:
            return Problem(
                ("workload",),
                f"ukernel jobs need exactly one dynamic dimension, M; this workload has {workload.symbolic}",
            )
        if workload.dtype != "float32":
            return Problem(("workload",), f"ukernel jobs support float32, not {workload.dtype}")
        s_max = max(shape[DIM] for shape, _ in distribution.support())
        if s_max > MAX_S:
            return Problem(("distribution",), f"ukernel jobs tune M up to {MAX_S}; the distribution reaches {s_max}")
        return None

    def check_tags(self, tags: Mapping[str, str]) -> Problem | None:
        return check_host_library(tags)

    def plan(self, workload: WorkloadSpec, distribution: ShapeDistribution, budget: Budget) -> Plan:
        if workload.op == "batch_matmul":
            return plan_bmm(workload, distribution, budget.max_shapes, self._ukernels(budget))
        if workload.op == "conv2d":
            return plan_conv(workload, distribution, budget.max_shapes, self._ukernels(budget))
        hot = planning.hot_shapes(workload, distribution, budget.max_shapes)
        shapes = [PlannedShape(shape=s, weight=w, priority=p, trials=1) for s, w, p in hot]
        s_max = max(shape[DIM] for shape, _ in distribution.support())
        unit = WorkUnit(f"{DIM}=1..{s_max}", tuple(shape_key(p.shape) for p in shapes), self._ukernels(budget))
        # progress: every uKernel built and measured, then every hot shape validated
        return Plan(shapes=shapes, units=[unit], trials_total=unit.trials + len(shapes))

    @staticmethod
    def _ukernels(budget: Budget) -> int:
        return min(int(budget.trials), MAX_UKERNELS)

    def run_unit(self, unit: WorkUnit, ctx: UnitContext) -> UnitResult:
        from service.tuning.tuners.ukernel.tuner import RangeTask, weighted_mean

        hot = self.plan(ctx.workload, ctx.distribution, ctx.budget).shapes
        if ctx.workload.op == "batch_matmul":  # several dynamic dims: a tuple table (kinds/ukernel_bmm.py)
            return run_bmm_unit(unit, ctx, hot)
        if ctx.workload.op == "conv2d":  # an implicit GEMM over M = N·OH·OW (kinds/ukernel_conv.py)
            return run_conv_unit(unit, ctx, hot)
        support = ctx.distribution.support()
        s_max = max(shape[DIM] for shape, _ in support)
        task = RangeTask(
            workload=ctx.workload,
            s_max=s_max,
            validate=[p.shape[DIM] for p in hot],
            target=ctx.target,
            max_ukernels=unit.trials,
            work_dir=ctx.work_dir,
            representative_m=weighted_mean(support, DIM),
        )
        outcome = tune_unit(unit, ctx, task, lambda S: shape_key({DIM: S}))
        error = verify(outcome, ctx.workload, ctx.platform)
        if error:
            return UnitResult(fatal=error)
        shapes = [
            ShapeOutcome(
                p.shape,
                latency_s=outcome.measured_s.get(p.shape[DIM]),
                vendor=ctx.platform.vendor(ctx.workload, p.shape),
            )
            for p in hot
        ]
        return publish_range(outcome, ctx, shapes, f"{DIM} in 1..{s_max}")

    # -- the fleet loop ------------------------------------------------------------------------------
    def fleet_trials(self, units: int, unit_trials: int) -> int:
        return MAX_UKERNELS  # a ukernel job's "trials" are the uKernels it builds

    def fleet_shapes(
        self, workload: WorkloadSpec, observed: Mapping[str, float], candidates: Mapping[str, float]
    ) -> dict[str, float]:
        # the whole observed range, up to what a job can tune (larger M run on the table's extended last interval):
        # each dim up to MAX_S, a conv's M = N·OH·OW up to MAX_CONV_M
        from service.models.shape import parse_shape_key

        def in_scope(shape: dict[str, int]) -> bool:
            if workload.op == "conv2d":
                from service.tuning.tuners.ukernel.conv import rows

                return rows(workload, shape) <= MAX_CONV_M
            return max(shape.values()) <= MAX_S

        return {k: w for k, w in observed.items() if in_scope(parse_shape_key(k))}

    def describe_config(self, config: Mapping[str, Any]) -> str:
        tile = "×".join(str(t) for t in config.get("tile", []))
        measured = config.get("measured") or {}
        sampled = ", ".join(sorted(measured, key=int))
        return f"{config.get('id', '?')} tile {tile}, score {config.get('score', 0):.3g}; timed at M = {sampled}"


# -- the dashboard ----------------------------------------------------------------------------------------
