"""A job kind that lives in the test suite only: `exhaustive` measures a fixed list of schedules per hot shape.

It shows that a kind is one module plus one registration line: loaded as a plugin
(KERNELFLEET_PLUGINS=tests.workers.exhaustive_kind) by the API and the workers, it runs through the real
job runner, store and SDK without any production module naming it. Each candidate is a MetaSchedule
trace (a split of the output's column loop by a fixed factor, vectorised), so the SDK rebuilds the best
one like any `sketch` config.
"""

from __future__ import annotations

from typing import Any, ClassVar

from service.models import Budget, WorkloadSpec, parse_shape_key, shape_key
from service.models.config import MeasuredCandidate
from service.models.distribution import ShapeDistribution
from service.models.plan import PlannedShape
from service.tuning import planning
from service.tuning.kinds import KINDS, JobKind, Plan, Problem, ShapeOutcome, UnitContext, UnitResult, WorkUnit
from service.tuning.platforms import tvm_target

FACTORS = (1, 4, 8, 16)  # the fixed list: inner extents of the vectorised column loop


def _candidate(workload: WorkloadSpec, shape: dict[str, int], factor: int, target: dict[str, object]) -> Any:
    import tvm
    import tvm_ffi
    from tvm import s_tir

    from kernelfleet.tvm_kernel import CONFIG_FORMAT_TRACE
    from service.tuning.compute import prim_func
    from service.tuning.tuners.trace_json import to_py

    mod = prim_func(workload, shape)
    sch = s_tir.Schedule(mod)
    block = sch.get_sblock("Y")
    _, j, _ = sch.get_loops(block)
    if factor > 1:
        sch.vectorize(sch.split(j, [None, factor])[1])
    return {
        "format": CONFIG_FORMAT_TRACE,
        "trace": to_py(sch.trace.as_json()),
        "module": tvm.ir.save_json(mod),
        "module_hash": str(tvm_ffi.structural_hash(mod)),
        "target": target,
    }


class ExhaustiveKind(JobKind):
    name = "exhaustive"
    summary = "test-only: every schedule of a fixed list, per hot shape"
    target_kinds: ClassVar[frozenset[str]] = frozenset({"llvm"})
    publishes = "configs"

    def validate(
        self, workload: WorkloadSpec, distribution: ShapeDistribution, target: Any, budget: Budget
    ) -> Problem | None:
        if workload.op != "dense" or workload.attrs.get("bias") or workload.dims.get("N", 16) % 16:
            return Problem(("workload",), "exhaustive jobs tune dense layers without bias whose N is a multiple of 16")
        return None

    def plan(self, workload: WorkloadSpec, distribution: ShapeDistribution, budget: Budget) -> Plan:
        shapes = [
            PlannedShape(shape=s, weight=w, priority=p, trials=len(FACTORS))
            for s, w, p in planning.hot_shapes(workload, distribution, budget.max_shapes)
        ]
        units = [WorkUnit(shape_key(p.shape), (shape_key(p.shape),), len(FACTORS)) for p in shapes]
        return Plan(shapes=shapes, units=units, trials_total=len(FACTORS) * len(shapes))

    def run_unit(self, unit: WorkUnit, ctx: UnitContext) -> UnitResult:
        from kernelfleet.tvm_kernel import build_kernel
        from service.tuning.compute import random_inputs, reference, tolerance

        shape = parse_shape_key(unit.key)
        inputs = random_inputs(ctx.workload, shape, seed=1)
        expected = reference(ctx.workload)(*inputs)
        best: tuple[float, dict[str, Any]] | None = None
        for factor in FACTORS:
            config = _candidate(ctx.workload, shape, factor, tvm_target(ctx.target))
            kernel = build_kernel(config)
            error = ctx.platform.check(kernel(*inputs), expected, tolerance(ctx.workload, shape))
            seconds = None if error else ctx.platform.time_call(kernel, *inputs)
            status = "ok" if error is None else "error"
            ctx.sink.on_candidates(unit.key, [MeasuredCandidate(config, seconds, status, error)])  # type: ignore[arg-type]
            if seconds is not None and (best is None or seconds < best[0]):
                best = (seconds, config)
        vendor = ctx.platform.vendor(ctx.workload, shape)
        if best is None:
            return UnitResult([ShapeOutcome(shape, error="every schedule failed", vendor=vendor)])
        seconds, config = best
        return UnitResult(
            [
                ShapeOutcome(
                    shape,
                    latency_s=seconds,
                    vendor=vendor,
                    config=config,
                    config_latency_s=seconds,
                    provenance={"tuner": self.name, "candidates": len(FACTORS)},
                )
            ]
        )


KINDS.register(ExhaustiveKind.name, ExhaustiveKind())
