"""`ukernel` jobs on conv2d (CPU targets): an NHWC layer with any of N, H, W symbolic, tuned as an implicit GEMM.

The layer is the dense layer Y[M, CO] = im2col(I)[M, KH·KW·CI]·Wᵀ over M = N·OH·OW (tuners.ukernel.conv): the
job tunes that dense layer over the distribution its tuples induce on M with the dense machinery (rules, cost
model, combination DP) up to M = MAX_S (the table's last interval serves larger M), routes M to a vendor
library's conv where one is faster at the support's own M (numpy's im2col GEMM, PyTorch's conv2d:
tuners.ukernel.conv.route_conv), and publishes the dense table over M with the conv's geometry (stride, padding,
filter sizes, static dims) as a kernelfleet.tables.ConvTable, signed like any other; the SDK loads it as a
ConvDispatcher (kernelfleet.conv_dispatcher), which maps a tuple to M in O(1). Its shape rows are the hot
tuples, timed through the conv dispatcher (im2col included) next to the vendor's conv.

Before publishing, the dense dispatcher is verified over M as for a dense job, and the conv dispatcher against
the numpy conv at every corner of the support's box and past it. Not covered: CUDA targets, float16, symbolic
CI, CO, KH or KW (they change K or the output width, not M), and bias or activation epilogues (the conv2d
operator has none). The operator is NHWC with an HWIO filter and has no dilation or groups: a workload naming
another layout or those attributes is refused when it is registered (422 at `workload.attrs.<name>`).
"""

from __future__ import annotations

from collections.abc import Mapping

from kernelfleet.conv_dispatcher import CONV_DIMS
from kernelfleet.tables import ConvTable
from service.models import TargetSpec, WorkloadSpec, shape_key
from service.models.distribution import ShapeDistribution
from service.models.plan import PlannedShape
from service.tuning import planning
from service.tuning.kinds.base import Plan, Problem, ShapeOutcome, UnitContext, UnitResult, WorkUnit
from service.tuning.kinds.ukernel_ops import UKernelOperator
from service.tuning.tuners.ukernel.bounds import MAX_CONV_M


def validate_conv(workload: WorkloadSpec, distribution: ShapeDistribution, target: TargetSpec) -> Problem | None:
    from service.tuning.tuners.ukernel.conv import rows_support

    if target.kind != "llvm":
        return Problem(("target", "kind"), "conv2d uKernels run on CPU (llvm) targets; there are no CUDA ones yet")
    if workload.dtype != "float32":
        return Problem(("workload", "dtype"), f"ukernel jobs support float32, not {workload.dtype}")
    for d in workload.symbolic:  # (no index in the loc: the service may hold the list in another order)
        if d not in CONV_DIMS:
            return Problem(
                ("workload", "symbolic"),
                f"conv2d ukernel jobs take dynamic {', '.join(CONV_DIMS)} (they change only M = N·OH·OW); "
                f"{d} must be static",
            )
    if not workload.symbolic:
        return Problem(("workload", "symbolic"), f"conv2d ukernel jobs need at least one of {list(CONV_DIMS)} dynamic")
    high = max(m[0]["M"] for m in rows_support(workload, distribution.support()))
    if high > MAX_CONV_M:
        return Problem(
            ("distribution",),
            f"conv2d ukernel jobs take M = N·OH·OW up to {MAX_CONV_M}; the distribution reaches M={high}",
        )
    return None


def plan_conv(workload: WorkloadSpec, distribution: ShapeDistribution, max_shapes: int, ukernels: int) -> Plan:
    from service.tuning.tuners.ukernel.conv import rows_support

    hot = planning.hot_shapes(workload, distribution, max_shapes)
    shapes = [PlannedShape(shape=s, weight=w, priority=p, trials=1) for s, w, p in hot]
    s_max = max(m["M"] for m, _ in rows_support(workload, distribution.support()))
    dims = ",".join(d for d in CONV_DIMS if d in workload.symbolic)
    unit = WorkUnit(f"{dims} as M=N·OH·OW=1..{s_max}", tuple(shape_key(p.shape) for p in shapes), ukernels)
    return Plan(shapes=shapes, units=[unit], trials_total=unit.trials + len(shapes))


def run_conv_unit(unit: WorkUnit, ctx: UnitContext, hot: list[PlannedShape]) -> UnitResult:
    from service.tuning.kinds.ukernel_range import publish_range, tune_unit, verify
    from service.tuning.tuners.ukernel import conv

    w = ctx.workload
    support = ctx.distribution.support()
    task = conv.conv_range_task(
        w, support, ctx.target, ctx.work_dir, max_ukernels=unit.trials, validate=[p.shape for p in hot]
    )
    row_of = {}  # each validated M counts on the first hot tuple that gives it
    for p in reversed(hot):
        row_of[conv.rows(w, p.shape)] = shape_key(p.shape)
    tuned = tune_unit(unit, ctx, task, row_of.get)
    error = verify(tuned, task.workload, ctx.platform)  # the dense programs over 1..MAX_S, as for a dense job
    if error:
        return UnitResult(fatal=error)
    outcome = conv.route_conv(tuned, w, support) if ctx.settings.ukernel_vendor_routes else tuned
    dispatcher = conv.dispatcher_of(outcome, w)
    error = conv.verify_conv(dispatcher, w, conv.check_tuples(w, support))  # every route, as a conv
    if error:
        return UnitResult(fatal=error)
    shapes = [
        ShapeOutcome(p.shape, latency_s=conv.time_conv(dispatcher, w, p.shape), vendor=ctx.platform.vendor(w, p.shape))
        for p in hot
    ]
    high = max(conv.rows(w, shape) for shape, _ in support)
    table = ConvTable(outcome.table, conv.geometry(w))
    return publish_range(outcome, ctx, shapes, f"M = N·OH·OW in 1..{high}", table)


def conv_in_scope(workload: WorkloadSpec, shape: Mapping[str, int]) -> bool:
    """Whether one job can tune up to `shape`: its M = N·OH·OW up to MAX_CONV_M."""
    from service.tuning.tuners.ukernel.conv import rows

    return rows(workload, shape) <= MAX_CONV_M


def conv2d_operator() -> UKernelOperator:
    """This family, as kinds/ukernel_ops.UKERNEL_OPERATORS loads it."""
    return UKernelOperator("conv2d", validate_conv, plan_conv, run_conv_unit, conv_in_scope)
