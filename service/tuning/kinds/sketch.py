"""`sketch` jobs: Ansor-style sketch search (TVM MetaSchedule + XGBoost) on the hot shapes of a distribution.

One unit per hot shape (priority = FLOPs × weight, DietCode), each with its share of the trial budget.
The best config of a shape is rebuilt exactly as the SDK will, checked against the reference and timed
as an inference host calls it, next to the vendor library: it is published only when it is faster.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel

from service.models import Budget, WorkloadSpec, parse_shape_key, shape_key
from service.models.config import MeasuredCandidate, TraceConfig
from service.models.distribution import ShapeDistribution
from service.tuning import planning
from service.tuning.kinds.base import JobKind, Plan, ShapeOutcome, UnitContext, UnitResult, WorkUnit
from service.tuning.platforms import TVMPlatform

log = logging.getLogger(__name__)


class SketchKind(JobKind):
    name = "sketch"
    summary = "Ansor-style sketch search: MetaSchedule with an XGBoost cost model, per hot shape"
    target_kinds: ClassVar[frozenset[str]] = frozenset({"llvm", "cuda"})
    publishes = "configs"
    default_trials = 256
    fleet_priority = 10
    config_schema: ClassVar[type[BaseModel] | None] = TraceConfig

    def plan(self, workload: WorkloadSpec, distribution: ShapeDistribution, budget: Budget) -> Plan:
        shapes = planning.plan(workload, distribution, budget.trials, budget.max_shapes)
        units = [WorkUnit(shape_key(p.shape), (shape_key(p.shape),), p.trials) for p in shapes]
        return Plan(shapes=shapes, units=units, trials_total=sum(p.trials for p in shapes))

    def run_unit(self, unit: WorkUnit, ctx: UnitContext) -> UnitResult:
        from kernelfleet.tvm_kernel import build_kernel
        from service.tuning.compute import random_inputs, reference, tolerance
        from service.tuning.tuners.sketch import SketchTask, SketchTuner

        platform = ctx.platform
        assert isinstance(platform, TVMPlatform)
        (key,) = unit.shape_keys
        shape = parse_shape_key(key)

        class _ShapeSink:
            def on_candidates(self, candidates: list[MeasuredCandidate]) -> None:
                ctx.sink.on_candidates(key, candidates)

            def should_stop(self) -> bool:
                return ctx.sink.should_stop()

        # A retry (the job's worker died) searches on from what earlier attempts measured, within the one budget.
        earlier = tuple(ctx.sink.earlier_candidates(key)[: unit.trials])
        if earlier:
            log.info("job %s: resuming %s from %d measured candidates", ctx.job_id, key, len(earlier))
            ctx.sink.on_progress(key, len(earlier))  # they count toward the shape's progress again
        task = SketchTask(
            ctx.workload,
            shape,
            ctx.target,
            unit.trials,
            ctx.work_dir,
            seed=ctx.budget.seed,
            measure_timeout_s=ctx.settings.measure_timeout_s,
            resume_from=earlier,
        )
        outcome = SketchTuner().tune(task, _ShapeSink())
        vendor = platform.vendor(ctx.workload, shape)
        if outcome.best_config is None or outcome.best_latency_s is None:
            return UnitResult([ShapeOutcome(shape, error=f"all {outcome.measured} candidates failed", vendor=vendor)])
        # rebuilt exactly as the SDK will, and timed as an inference host calls it (Python call included)
        kernel = build_kernel(outcome.best_config)
        inputs = random_inputs(ctx.workload, shape, seed=1)
        error = platform.check(kernel(*inputs), reference(ctx.workload)(*inputs), tolerance(ctx.workload, shape))
        if error:
            return UnitResult([ShapeOutcome(shape, error=f"tuned kernel: {error}", vendor=vendor)])
        call, args = platform.host_call(kernel, inputs)
        seconds = platform.time_call(call, *args)
        result = ShapeOutcome(
            shape,
            latency_s=seconds,
            vendor=vendor,
            config=outcome.best_config,
            config_latency_s=outcome.best_latency_s,
            provenance={"tuner": "sketch", "trials": outcome.measured},
        )
        # A tiny kernel can win in TVM's timing loop and still lose to the vendor once Python and thread
        # wake-up are paid: serve it only where it beats the vendor as an inference host calls both.
        if ctx.settings.publish_only_faster_than_vendor and seconds >= vendor.seconds:
            result.not_published = (
                f"the vendor is faster as called ({vendor.seconds * 1e6:.1f} µs vs {seconds * 1e6:.1f} µs)"
            )
        return UnitResult([result])

    def describe_config(self, config: Mapping[str, Any]) -> str:
        return trace_summary(config)


def trace_summary(config: Mapping[str, Any]) -> str:
    """A MetaSchedule trace in one line: its sampled tile sizes and unroll factor (what the search varied)."""
    try:
        insts, decisions = config["trace"]
        tiles, unroll = [], ""
        for index, decision in decisions:
            name, _, attrs, _ = insts[index]
            if name == "SamplePerfectTile":
                tiles.append("·".join(str(t) for t in decision))
            elif name == "SampleCategorical":
                unroll = f", unroll {attrs[0][decision]}"
        return f"tiles {' × '.join(tiles)}{unroll} ({len(insts)} steps)"
    except (KeyError, ValueError, TypeError, IndexError):
        return str(config.get("format", "config"))
