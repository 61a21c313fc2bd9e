"""A `ukernel` unit over one dynamic M, shared by the dense and conv2d paths (kinds/ukernel.py, kinds/ukernel_conv.py):
tune a dense range task as a job's unit (candidates, resuming, progress), verify its dispatcher as the SDK runs it,
and publish its table over M or say why not.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from kernelfleet.tables import TableVariant
from service.models import WorkloadSpec
from service.models.artifact import Artifact
from service.models.config import MeasuredCandidate
from service.tuning.kinds.base import DispatchPublication, ShapeOutcome, UnitContext, UnitResult, WorkUnit
from service.tuning.kinds.host_library import host_library, route_libraries
from service.tuning.platforms import Platform
from service.tuning.platforms.base import check_result

if TYPE_CHECKING:  # annotations only: the tuners (and TVM with them) load when a unit runs
    from service.tuning.tuners.base import Tuner
    from service.tuning.tuners.ukernel.tuner import RangeOutcome, RangeSink, RangeTask

log = logging.getLogger(__name__)

DIM = "M"


def _candidates(records: list[dict[str, Any]]) -> list[MeasuredCandidate]:
    """Every uKernel the rules proposed, as the job's measured candidates (its time at the largest M sampled)."""
    out = []
    for r in records:
        measured = r.get("measured") or {}
        latency = measured[max(measured, key=int)] if measured else None
        out.append(
            MeasuredCandidate(
                config={"format": "ukernel-tile", **r},
                latency_s=latency,
                status="ok" if "error" not in r else "error",
                error=r.get("error"),
            )
        )
    return out


def _next_prime(n: int) -> int:
    while n < 2 or any(n % d == 0 for d in range(2, int(n**0.5) + 1)):
        n += 1
    return n


def verification_shapes(outcome: RangeOutcome) -> list[int]:
    """Every S up to 256, both ends of every interval (so every program shape runs), and primes past the
    tuned range (where the table extends its last interval)."""
    s_max = outcome.table.s_max
    shapes = set(range(1, min(s_max, 256) + 1))
    for iv in outcome.table.intervals:
        shapes |= {iv.lo, iv.hi}
    shapes |= {_next_prime(s_max + 1), _next_prime(2 * s_max + 1)}
    return sorted(shapes)


def verify(outcome: RangeOutcome, workload: WorkloadSpec, platform: Platform | None = None) -> str | None:
    """Run the dispatcher exactly as the SDK will and compare with the reference; the first error, or None."""
    from kernelfleet.dispatcher import Dispatcher
    from service.tuning.compute import random_inputs, reference, tolerance

    N, K = workload.dims["N"], workload.dims["K"]
    # GPU outcomes bring their CudaDispatcher (numpy in, copied to the device, numpy out)
    dispatcher = outcome.dispatcher or Dispatcher(outcome.table, outcome.kernels, N=N, K=K)
    x_all, w, *bias = random_inputs(workload, {DIM: max(verification_shapes(outcome))}, seed=1)
    b = bias[0] if bias else None  # present iff the layer adds one
    # rows are independent: the reference once for every row (numpy's float16 matmul has no BLAS: once, not per S)
    expected = np.asarray(reference(workload)(x_all, w, *bias))
    check = platform.check if platform is not None else check_result
    for S in verification_shapes(outcome):
        x = x_all[:S]
        got = dispatcher(x, w) if b is None else dispatcher(x, w, bias=b)
        error = check(got, expected[:S], tolerance(workload, {DIM: S}))
        if error:
            return f"program for {DIM}={S}: {error}"
    return None


def artifacts_of(outcome: RangeOutcome) -> list[Artifact]:
    """The outcome's libraries, read while its work dir exists."""
    return [
        Artifact(ukernel_id=uid, sha256=a.sha256, spec=a.spec.to_dict(), data=a.path.read_bytes())
        for uid, a in outcome.artifacts.items()
    ]


def validation_record(outcome: RangeOutcome, worker: str) -> dict[str, Any]:
    """What is stored with a table about how it was chosen and how well the models ranked."""
    return {
        **outcome.validation,
        "tuning_seconds": outcome.seconds,
        "padding_ratio": outcome.padding_ratio,
        "candidates": outcome.candidates,
        "hardware": outcome.hardware,
        "worker": worker,
    }


def tune_unit(
    unit: WorkUnit, ctx: UnitContext, task: RangeTask, progress_key: Callable[[int], str | None]
) -> RangeOutcome:
    """Run a dense range task as a job's unit: the target's tuner, every uKernel reported as a candidate as soon
    as it is measured, a retry resuming from what an earlier attempt measured, each validated S counted on the
    shape row `progress_key(S)` names."""
    from service.tuning.tuners.base import TuningStopped
    from service.tuning.tuners.ukernel.tuner import UKernelTuner

    tuner: Tuner[RangeTask, RangeSink, RangeOutcome] = UKernelTuner()
    if ctx.target.kind == "cuda":  # FTuner's GPU rules, pipelined uKernels, depth searched on the GPU
        from service.tuning.tuners.ukernel.gpu_tuner import GPUUKernelTuner

        tuner = GPUUKernelTuner()

    class _Progress:
        def on_ukernel(self, record: dict[str, Any]) -> None:
            ctx.sink.on_candidates(unit.key, _candidates([record]))

        def on_validated(self, S: int, measured: int) -> None:
            ctx.sink.on_progress(progress_key(S), 1)

        def should_stop(self) -> bool:
            return ctx.sink.should_stop()

    # a retried job rebuilds the uKernels an earlier attempt measured and keeps their timings
    measured_before = {
        str(c.config["id"]): c.config["measured"]
        for c in ctx.sink.earlier_candidates(unit.key)
        if c.status == "ok" and c.config.get("measured")
    }
    if measured_before:
        log.info("job %s: resuming from %d measured uKernels", ctx.job_id, len(measured_before))
        ctx.sink.on_progress(None, len(measured_before))  # they count toward progress again
    task = replace(
        task,
        measured_before=measured_before,
        # the setting can only turn the GEMM sweep off: a task that routes elsewhere (a conv's routes are decided
        # as convs, tuners.ukernel.conv.route_conv) has it off, and GEMM routes would cover the spans it keeps
        vendor_routes=task.vendor_routes and ctx.settings.ukernel_vendor_routes,
        vendor_libraries=route_libraries(ctx.tags),
        measure_timeout_s=ctx.settings.measure_timeout_s,
    )
    outcome = tuner.tune(task, _Progress())
    if ctx.sink.should_stop():
        raise TuningStopped("stopped by the job")
    return outcome


def publish_range(
    outcome: RangeOutcome, ctx: UnitContext, shapes: list[ShapeOutcome], covers: str, table: TableVariant
) -> UnitResult:
    """A verified range outcome as the unit's dispatch `table` over M (the outcome's table, as its family's
    variant), or why it is not published: the hosts' library (the job's host_library) is fastest at every S it
    `covers` (e.g. "M in 1..128")."""
    library = host_library(ctx.tags)
    if not outcome.changes_for(library) and ctx.settings.publish_only_faster_than_vendor:
        # every S went to the library the hosts run anyway: the table would change nothing for them
        routes = outcome.validation.get("vendor_routes", {})
        return UnitResult(
            shapes=shapes,
            not_published=f"the hosts' library ({library}) is faster as the SDK calls it at every {covers} "
            f"({routes.get('shapes_timed', 0)} timed): no dispatch table published",
        )
    publication = DispatchPublication(
        dim=DIM,
        table=table,
        artifacts=artifacts_of(outcome),
        predicted=outcome.predicted_s,
        measured=outcome.measured_s,
        validation=validation_record(outcome, ctx.worker),
    )
    return UnitResult(shapes=shapes, dispatch=publication)
