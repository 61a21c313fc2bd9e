"""`ukernel` jobs on dense layers (CPU and CUDA targets): one dynamic dim M, tuned as one range unit
(kinds/ukernel_range.py) and published as a kernelfleet.tables.DenseTable."""

from __future__ import annotations

from kernelfleet.tables import DenseTable
from service.models import TargetSpec, WorkloadSpec, shape_key
from service.models.distribution import ShapeDistribution
from service.models.plan import PlannedShape
from service.tuning import planning
from service.tuning.builder.cuda import supports_async_copy
from service.tuning.kinds.base import Plan, Problem, ShapeOutcome, UnitContext, UnitResult, WorkUnit
from service.tuning.kinds.ukernel_ops import UKernelOperator, every_dim_up_to_max_s
from service.tuning.kinds.ukernel_range import DIM, publish_range, tune_unit, verify
from service.tuning.tuners.ukernel.bounds import MAX_S


def check_dtype(dtype: str, target: TargetSpec) -> Problem | None:
    """float32 anywhere; float16 and bfloat16 on CUDA GPUs with tensor cores and cp.async (sm_80+), where the
    GPU tuner proposes mma.sync tiles and the GEMV family in that dtype (Y in the inputs' dtype, fp32 sums)."""
    if dtype == "float32":
        return None
    if target.kind != "cuda":
        return Problem(("workload", "dtype"), f"ukernel jobs on {target.kind} targets tune float32, not {dtype}")
    if not supports_async_copy(target.arch or ""):
        return Problem(
            ("workload", "dtype"),
            f"{dtype} uKernels need tensor cores with cp.async: sm_80 or newer, not {target.arch or 'no arch'}",
        )
    return None


def validate_dense(workload: WorkloadSpec, distribution: ShapeDistribution, target: TargetSpec) -> Problem | None:
    if target.kind == "cuda" and (workload.attrs.get("bias") or workload.attrs.get("activation", "none") != "none"):
        return Problem(("workload", "attrs"), "CPU targets fuse bias and activation; CUDA uKernels do not yet")
    if workload.symbolic != [DIM]:
        return Problem(
            ("workload",),
            f"ukernel jobs need exactly one dynamic dimension, M; this workload has {workload.symbolic}",
        )
    if problem := check_dtype(workload.dtype, target):
        return problem
    s_max = max(shape[DIM] for shape, _ in distribution.support())
    if s_max > MAX_S:
        return Problem(("distribution",), f"ukernel jobs tune M up to {MAX_S}; the distribution reaches {s_max}")
    return None


def plan_dense(workload: WorkloadSpec, distribution: ShapeDistribution, max_shapes: int, ukernels: int) -> Plan:
    hot = planning.hot_shapes(workload, distribution, max_shapes)
    shapes = [PlannedShape(shape=s, weight=w, priority=p, trials=1) for s, w, p in hot]
    s_max = max(shape[DIM] for shape, _ in distribution.support())
    unit = WorkUnit(f"{DIM}=1..{s_max}", tuple(shape_key(p.shape) for p in shapes), ukernels)
    # progress: every uKernel built and measured, then every hot shape validated
    return Plan(shapes=shapes, units=[unit], trials_total=unit.trials + len(shapes))


def run_dense_unit(unit: WorkUnit, ctx: UnitContext, hot: list[PlannedShape]) -> UnitResult:
    from service.tuning.tuners.ukernel.tuner import RangeTask, weighted_mean

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
    return publish_range(outcome, ctx, shapes, f"{DIM} in 1..{s_max}", DenseTable(outcome.table))


def dense_operator() -> UKernelOperator:
    """This family, as kinds/ukernel_ops.UKERNEL_OPERATORS loads it."""
    return UKernelOperator("dense", validate_dense, plan_dense, run_dense_unit, every_dim_up_to_max_s)
