"""`ukernel` jobs: FTuner/DietCode micro-kernels for a whole dynamic range, published as a dispatch table.

Unlike a `sketch` job (one search per hot shape), the job tunes the range M = 1..S_max once, as one
unit. Its shape rows are the hot shapes it validates: each is measured with every uKernel alone and with
the program the table chose, next to the vendor library, so the job reports speedups per shape. The
table routes every S where the vendor (numpy) is faster as the SDK calls both to the vendor (the tuner
times both on a geometric grid of S and the hot shapes, bisects every crossing to the exact S and, between
points that agree, measures where its calibrated cost model doubts the winner: `tuners.ukernel.vendor_routes`);
a table that would route every S to the vendor is not published, and
the job says so (`published: false` with the reason). Before anything is published the SDK dispatcher
runs every S ≤ 256, both ends of every interval and two primes past S_max against the reference.

A layer's bias and activation (dense attrs) are fused into every uKernel on CPU targets, and the vendor side
of every timing runs them too (numpy, as a host would); CUDA uKernels do not fuse them yet.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel

from service.models import Budget, TargetSpec, WorkloadSpec, shape_key
from service.models.artifact import Artifact
from service.models.config import MeasuredCandidate, UKernelTileConfig
from service.models.distribution import ShapeDistribution
from service.models.plan import PlannedShape
from service.tuning import planning
from service.tuning.kinds.base import (
    DispatchPublication,
    JobKind,
    Plan,
    Problem,
    ShapeOutcome,
    UnitContext,
    UnitResult,
    WorkUnit,
)
from service.tuning.kinds.ukernel_bmm import plan_bmm, run_bmm_unit, validate_bmm
from service.tuning.kinds.ukernel_conv import plan_conv, run_conv_unit, validate_conv
from service.tuning.platforms import Platform
from service.tuning.platforms.base import check_result
from service.tuning.tuners.ukernel.limits import MAX_S, MAX_UKERNELS

log = logging.getLogger(__name__)

DIM = "M"


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
        from service.tuning.tuners.ukernel.tuner import RangeTask

        hot = self.plan(ctx.workload, ctx.distribution, ctx.budget).shapes
        if ctx.workload.op == "batch_matmul":  # several dynamic dims: a tuple table (kinds/ukernel_bmm.py)
            return run_bmm_unit(unit, ctx, hot)
        if ctx.workload.op == "conv2d":  # an implicit GEMM over M = N·OH·OW (kinds/ukernel_conv.py)
            return run_conv_unit(unit, ctx, hot)
        support = ctx.distribution.support()
        s_max = max(shape[DIM] for shape, _ in support)
        total = sum(w for _, w in support)
        task = RangeTask(
            workload=ctx.workload,
            s_max=s_max,
            validate=[p.shape[DIM] for p in hot],
            target=ctx.target,
            max_ukernels=unit.trials,
            work_dir=ctx.work_dir,
            representative_m=max(1, round(sum(shape[DIM] * w for shape, w in support) / total)),
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

    def fleet_shapes(self, observed: Mapping[str, float], candidates: Mapping[str, float]) -> dict[str, float]:
        # the whole observed range, up to what a job can tune (larger M run on the table's extended last interval)
        from service.models.shape import parse_shape_key

        return {k: w for k, w in observed.items() if max(parse_shape_key(k).values()) <= MAX_S}

    def describe_config(self, config: Mapping[str, Any]) -> str:
        tile = "×".join(str(t) for t in config.get("tile", []))
        measured = config.get("measured") or {}
        sampled = ", ".join(sorted(measured, key=int))
        return f"{config.get('id', '?')} tile {tile}, score {config.get('score', 0):.3g}; timed at M = {sampled}"


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


def verification_shapes(outcome: Any) -> list[int]:
    """Every S up to 256, both ends of every interval (so every program shape runs), and primes past the
    tuned range (where the table extends its last interval)."""
    s_max = outcome.table.s_max
    shapes = set(range(1, min(s_max, 256) + 1))
    for iv in outcome.table.intervals:
        shapes |= {iv.lo, iv.hi}
    shapes |= {_next_prime(s_max + 1), _next_prime(2 * s_max + 1)}
    return sorted(shapes)


def verify(outcome: Any, workload: WorkloadSpec, platform: Platform | None = None) -> str | None:
    """Run the dispatcher exactly as the SDK will and compare with the reference; the first error, or None."""
    from kernelfleet.dispatcher import Dispatcher
    from service.tuning.compute import random_inputs, reference, tolerance

    N, K = workload.dims["N"], workload.dims["K"]
    # GPU outcomes bring their CudaDispatcher (numpy in, copied to the device, numpy out)
    dispatcher = outcome.dispatcher or Dispatcher(outcome.table, outcome.kernels, N=N, K=K)
    x_all, w, *bias = random_inputs(workload, {DIM: max(verification_shapes(outcome))}, seed=1)
    b = bias[0] if bias else None  # present iff the layer adds one
    for S in verification_shapes(outcome):
        x = x_all[:S]
        check = platform.check if platform is not None else check_result
        got = dispatcher(x, w) if b is None else dispatcher(x, w, bias=b)
        error = check(got, np.asarray(reference(workload)(x, w, *bias)), tolerance(workload, {DIM: S}))
        if error:
            return f"program for {DIM}={S}: {error}"
    return None


def artifacts_of(outcome: Any) -> list[Artifact]:
    """The outcome's libraries, read while its work dir exists."""
    return [
        Artifact(ukernel_id=uid, sha256=a.sha256, spec=a.spec.to_dict(), data=a.path.read_bytes())
        for uid, a in outcome.artifacts.items()
    ]


def validation_record(outcome: Any, worker: str) -> dict[str, Any]:
    """What is stored with a table about how it was chosen and how well the models ranked."""
    return {
        **outcome.validation,
        "tuning_seconds": outcome.seconds,
        "padding_ratio": outcome.padding_ratio,
        "candidates": outcome.candidates,
        "hardware": outcome.hardware,
        "worker": worker,
    }


def tune_unit(unit: WorkUnit, ctx: UnitContext, task: Any, progress_key: Callable[[int], str | None]) -> Any:
    """Run a dense range task (tuners.ukernel.tuner.RangeTask) as a job's unit: the target's tuner, every uKernel
    reported as a candidate as soon as it is measured, a retry resuming from what an earlier attempt measured,
    each validated S counted on the shape row `progress_key(S)` names. Returns the RangeOutcome."""
    from service.tuning.tuners.base import TuningStopped
    from service.tuning.tuners.ukernel.tuner import UKernelTuner

    tuner: Any = UKernelTuner()
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
        vendor_routes=ctx.settings.ukernel_vendor_routes,
        measure_timeout_s=ctx.settings.measure_timeout_s,
    )
    outcome = tuner.tune_range(task, _Progress())
    if ctx.sink.should_stop():
        raise TuningStopped("stopped by the job")
    return outcome


def publish_range(
    outcome: Any, ctx: UnitContext, shapes: list[ShapeOutcome], covers: str, extra: Mapping[str, Any] | None = None
) -> UnitResult:
    """A verified range outcome as the unit's dispatch table over M (`extra`: more keys in the table), or why
    it is not published: the vendor is faster at every S it `covers` (e.g. "M in 1..128")."""
    if not outcome.serves_ukernels and ctx.settings.publish_only_faster_than_vendor:
        # every S went to the vendor: a table of vendor routes only would change nothing for anyone
        routes = outcome.validation.get("vendor_routes", {})
        return UnitResult(
            shapes=shapes,
            not_published=f"the vendor (numpy) is faster as the SDK calls both at every {covers} "
            f"({routes.get('shapes_timed', 0)} timed): no dispatch table published",
        )
    publication = DispatchPublication(
        dim=DIM,
        table={**outcome.table.to_dict(), **(extra or {})},
        artifacts=artifacts_of(outcome),
        predicted=outcome.predicted_s,
        measured=outcome.measured_s,
        validation=validation_record(outcome, ctx.worker),
    )
    return UnitResult(shapes=shapes, dispatch=publication)


# -- the dashboard ----------------------------------------------------------------------------------------
