"""`ukernel` jobs on batch_matmul (CPU targets): 1–3 symbolic dims among B, M, N, K, one TupleDispatchTable.

The distribution may be any form over the workload's symbolic dims: a joint Explicit one (e.g. attention's T
in M and N as points {M: t, N: t}, or observed tuples with their counts as weights), an Independent product,
or one marginal for a single symbolic dim. Its support is grouped into cells (geometric classes per dim,
kernelfleet.tuple_dispatch); every cell with mass is planned once (tuners.ukernel.bmm_tuner), and the table
routes each, per layout a host passes Bt in, to a uKernel or to the vendor library fastest in that layout. Before
publishing, the dispatcher runs at both corners of every planned cell, in both layouts, against numpy in float64.
The table is published like a dense one (its `dim` is the symbolic dims joined with commas, e.g. "M,N"), signed
with the same key, and the SDK loads it as a BmmDispatcher.
"""

from __future__ import annotations

from typing import Any

from kernelfleet.bmm_dispatcher import BNK
from kernelfleet.bmm_ukernel import BMM_DIMS
from kernelfleet.tables import BatchMatmulTable
from kernelfleet.vendor import is_vendor
from service.models import TargetSpec, WorkloadSpec, shape_key
from service.models.artifact import Artifact
from service.models.config import MeasuredCandidate
from service.models.distribution import ShapeDistribution
from service.models.plan import PlannedShape
from service.tuning import planning
from service.tuning.kinds.base import (
    DispatchPublication,
    Plan,
    Problem,
    ShapeOutcome,
    UnitContext,
    UnitResult,
    WorkUnit,
)
from service.tuning.kinds.host_library import host_library
from service.tuning.kinds.ukernel_ops import UKernelOperator, every_dim_up_to_max_s
from service.tuning.tuners.ukernel.bounds import MAX_S

MAX_SYMBOLIC = 3
MAX_CELLS = 256  # planned classes per job: each is timed at up to 4 tuples with every uKernel and numpy


def symbolic_dims(workload: WorkloadSpec) -> tuple[str, ...]:
    return tuple(d for d in BMM_DIMS if d in workload.symbolic)


def validate_bmm(workload: WorkloadSpec, distribution: ShapeDistribution, target: TargetSpec) -> Problem | None:
    from service.tuning.tuners.ukernel.bmm_tuner import plan_cells

    if target.kind != "llvm":
        return Problem(
            ("target", "kind"), "batch_matmul uKernels run on CPU (llvm) targets; there are no CUDA ones yet"
        )
    if workload.dtype != "float32":
        return Problem(("workload", "dtype"), f"ukernel jobs support float32, not {workload.dtype}")
    dims = symbolic_dims(workload)
    if not 1 <= len(dims) <= MAX_SYMBOLIC:
        return Problem(
            ("workload", "symbolic"),
            f"batch_matmul ukernel jobs take 1 to {MAX_SYMBOLIC} dynamic dims of {list(BMM_DIMS)}; "
            f"this workload has {workload.symbolic}",
        )
    support = distribution.support()
    for d in dims:
        high = max(shape[d] for shape, _ in support)
        if high > MAX_S:
            return Problem(("distribution",), f"ukernel jobs tune {d} up to {MAX_S}; the distribution reaches {high}")
    _, cells = plan_cells(dims, support)
    if len(cells) > MAX_CELLS:
        return Problem(
            ("distribution",),
            f"the distribution covers {len(cells)} classes of {','.join(dims)} (geometric classes per dim); "
            f"a batch_matmul ukernel job plans at most {MAX_CELLS}",
        )
    return None


def plan_bmm(workload: WorkloadSpec, distribution: ShapeDistribution, max_shapes: int, ukernels: int) -> Plan:
    hot = planning.hot_shapes(workload, distribution, max_shapes)
    shapes = [PlannedShape(shape=s, weight=w, priority=p, trials=1) for s, w, p in hot]
    unit = WorkUnit(f"{','.join(symbolic_dims(workload))} classes", tuple(shape_key(p.shape) for p in shapes), ukernels)
    return Plan(shapes=shapes, units=[unit], trials_total=unit.trials + len(shapes))


def run_bmm_unit(unit: WorkUnit, ctx: UnitContext, hot: list[PlannedShape]) -> UnitResult:
    from service.tuning.platforms import tvm_target
    from service.tuning.tuners.base import TuningStopped
    from service.tuning.tuners.ukernel.bmm_tuner import (
        BmmRangeTask,
        BmmUKernelTuner,
        time_programs,
        timed_key,
        verify_bmm,
    )

    static = {d: int(v) for d, v in ctx.workload.dims.items()}
    task = BmmRangeTask(
        static=static,
        support=ctx.distribution.support(),
        target=tvm_target(ctx.target),
        work_dir=ctx.work_dir,
        max_ukernels=unit.trials,
        vendor_routes=ctx.settings.ukernel_vendor_routes,
    )
    outcome = BmmUKernelTuner().tune(task, ctx.sink)
    ctx.sink.on_candidates(
        unit.key,
        [
            MeasuredCandidate(config={"format": "ukernel-tile", **r}, latency_s=None, status="ok")
            for r in outcome.candidates
        ],
    )
    if ctx.sink.should_stop():
        raise TuningStopped("stopped by the job")
    dispatcher = outcome.dispatcher(static)
    error = verify_bmm(dispatcher, static)
    if error:
        return UnitResult(fatal=error)
    shapes = []
    for p in hot:
        full = {**static, **p.shape}
        # in the operator's own layout (Bt contiguous), the one the shape's vendor baseline is timed in
        uid = dispatcher.program(full, BNK)
        kernels = {} if uid is None or is_vendor(uid) else {uid: outcome.kernels[uid]}
        ours = None if uid is None else time_programs(kernels, full, 0.002, 2, (BNK,))[timed_key(uid, BNK)]
        shapes.append(ShapeOutcome(p.shape, latency_s=ours, vendor=ctx.platform.vendor(ctx.workload, p.shape)))
        ctx.sink.on_progress(shape_key(p.shape), 1)
    dims = ",".join(outcome.table.dims)
    validation: dict[str, Any] = {
        "timed_s": outcome.measured,
        "tuning_seconds": outcome.seconds,
        "candidates": outcome.candidates,
        "worker": ctx.worker,
    }
    library = host_library(ctx.tags)
    if not outcome.changes_for(library) and ctx.settings.publish_only_faster_than_vendor:
        return UnitResult(
            shapes=shapes,
            not_published=f"the hosts' library ({library}) is faster at every planned class of {dims}: "
            "no dispatch table published",
        )
    artifacts = [
        Artifact(ukernel_id=uid, sha256=a.sha256, spec=a.spec.to_dict(), data=a.path.read_bytes())
        for uid, a in outcome.artifacts.items()
    ]
    publication = DispatchPublication(
        dim=dims,
        table=BatchMatmulTable(outcome.table, static),
        artifacts=artifacts,
        predicted=[],
        measured={},
        validation=validation,
    )
    return UnitResult(shapes=shapes, dispatch=publication)


def batch_matmul_operator() -> UKernelOperator:
    """This family, as kinds/ukernel_ops.UKERNEL_OPERATORS loads it."""
    return UKernelOperator("batch_matmul", validate_bmm, plan_bmm, run_bmm_unit, every_dim_up_to_max_s)
