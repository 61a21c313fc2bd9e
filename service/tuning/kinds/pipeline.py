"""`pipeline` jobs: ALCOP's multi-stage, multi-level pipelining schedules for GEMM-like operators on GPUs.

`dense`, `batch_matmul` (attention's QK and SV included) and `conv2d` (as an implicit GEMM) on `cuda`
targets of sm_80 or newer (cp.async). One unit per hot shape, like `sketch`: the legal configurations
of the schedule space are ranked by ALCOP's analytical model (constants per arch, calibrated from the
pipeline kernels this target already measured in the store) and searched with an XGBoost cost model
pre-trained on the model's predictions ("anal+xgb", the default), or measured in model order
("analytical"; tag `pipeline_search`). Every job records best-in-top-k and the model's rank correlation.
The best kernel per shape is rebuilt, checked against the reference and published as an ordinary best
config (format `pipeline-gemm`). A conv2d kernel takes its filter packed as W[CO, KH·KW·CI]
(`lowering.pack_filter`, once per weight) and writes the NHWC output. Jobs are queued on `gpu.<arch>`
and only GPU workers consume them.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from service.models import Budget, TargetSpec, WorkloadSpec, parse_shape_key, shape_key
from service.models.config import MeasuredCandidate, PipelineGemmConfig
from service.models.distribution import ShapeDistribution
from service.tuning import planning
from service.tuning.kinds.base import JobKind, Plan, Problem, ShapeOutcome, UnitContext, UnitResult, WorkUnit

if TYPE_CHECKING:
    from service.tuning.tuners.pipeline.model import GPUConstants, Sample
    from service.tuning.tuners.pipeline.space import GemmShape, PipelineConfig
    from service.tuning.tuners.pipeline.tuner import Mode

log = logging.getLogger(__name__)

OPS = ("dense", "batch_matmul", "conv2d")
MIN_SM = 80  # cp.async (asynchronous global→shared copies) arrived with Ampere
SEARCH_TAG = "pipeline_search"
CONFIG_FORMAT = "pipeline-gemm"
_SM = re.compile(r"^sm_(\d{2,3})a?$")


def sm_version(arch: str | None) -> int | None:
    match = _SM.match(arch or "")
    return int(match.group(1)) if match else None


class PipelineKind(JobKind):
    name = "pipeline"
    summary = (
        "ALCOP pipelining: multi-stage, multi-level software pipelines for dense, batch_matmul and conv2d "
        "(implicit GEMM) on sm_80+ GPUs, ranked by its analytical model with an XGBoost model pre-trained on it"
    )
    target_kinds: ClassVar[frozenset[str]] = frozenset({"cuda"})
    config_schema: ClassVar[type[BaseModel] | None] = PipelineGemmConfig
    publishes = "configs"
    default_trials = 64
    fleet_priority = 15  # on a GPU, above sketch (the generic search) and below ukernel (whole ranges)

    def validate(
        self, workload: WorkloadSpec, distribution: ShapeDistribution, target: TargetSpec, budget: Budget
    ) -> Problem | None:
        version = sm_version(target.arch)
        if version is None or version < MIN_SM:
            return Problem(
                ("target", "arch"),
                f"pipeline jobs need asynchronous copies: sm_{MIN_SM} or newer, not {target.arch or 'no arch'}",
            )
        if workload.op not in OPS:
            return Problem(("workload", "op"), f"pipeline jobs tune {', '.join(OPS)}, not {workload.op}")
        if workload.op == "dense" and workload.attrs.get("bias"):
            return Problem(("workload", "attrs", "bias"), "pipeline jobs tune dense layers without bias")
        if workload.attrs.get("activation", "none") != "none":
            return Problem(("workload", "attrs", "activation"), "pipeline jobs tune dense layers without an activation")
        if workload.op == "conv2d" and "CI" in workload.dims:
            from service.tuning.tuners.pipeline.lowering import Conv2dGeometry, check_conv

            dims = {**dict.fromkeys(workload.symbolic, 1), **workload.dims}
            problem = check_conv(Conv2dGeometry.of(dims, workload.attrs), workload.dtype)
            if problem:
                return Problem(("workload", "dims", "CI"), problem)
        return None

    def check_tags(self, tags: Mapping[str, str]) -> Problem | None:
        try:
            search_mode(tags)
        except ValueError as exc:
            return Problem(("tags", SEARCH_TAG), str(exc))
        return None

    def plan(self, workload: WorkloadSpec, distribution: ShapeDistribution, budget: Budget) -> Plan:
        shapes = planning.plan(workload, distribution, budget.trials, budget.max_shapes)
        units = [WorkUnit(shape_key(p.shape), (shape_key(p.shape),), p.trials) for p in shapes]
        return Plan(shapes=shapes, units=units, trials_total=sum(p.trials for p in shapes))

    def run_unit(self, unit: WorkUnit, ctx: UnitContext) -> UnitResult:
        from service.tuning.tuners.base import TuningStopped
        from service.tuning.tuners.pipeline import lowering
        from service.tuning.tuners.pipeline.model import predict
        from service.tuning.tuners.pipeline.tuner import MeasuringSink, PipelineTask, PipelineTuner

        (key,) = unit.shape_keys
        shape = parse_shape_key(key)
        gemm = lowering.gemm_for(ctx.workload, shape)
        gpu = gpu_constants(ctx.target, calibration_samples(ctx.sink.target_candidates(CONFIG_FORMAT, 2000)))
        mode = search_mode(ctx.tags)
        measure = lowering.Measurer(ctx.workload, shape, ctx.target, ctx.settings.measure_timeout_s)

        def measure_and_report(configs: Sequence[PipelineConfig]) -> list[float]:
            seconds = measure(configs)
            predicted = {c: predict(gemm, c, gpu).seconds for c in configs}  # kept with each measurement
            pairs = zip(configs, seconds, strict=True)
            ctx.sink.on_candidates(
                key, [candidate(gemm, c, s, measure.errors.get(c), predicted.get(c)) for c, s in pairs]
            )
            return seconds

        earlier = earlier_measurements(ctx.sink.earlier_candidates(key))
        task = PipelineTask(gemm, gpu, unit.trials, mode, seed=ctx.budget.seed or 0, resume_from=earlier)
        try:
            outcome = PipelineTuner().tune(task, MeasuringSink(measure_and_report, ctx.sink.should_stop))
            seconds, error = measure.verify(outcome.best.config) if outcome.best else (math.inf, None)
        finally:
            measure.close()
        if ctx.sink.should_stop():
            raise TuningStopped("stopped by the job")
        best = outcome.best
        if best is None:
            first = next(iter(measure.errors.values()), "")
            failed = f"all {len(outcome.proposals)} candidates failed" + (f"; first: {first}" if first else "")
            return UnitResult([ShapeOutcome(shape, error=failed)])
        # our kernel is timed kernel-only (time_evaluator), so the vendor is too (a CUDA graph of its calls)
        vendor = ctx.platform.vendor(ctx.workload, shape, kernel_only=True)
        if error:
            return UnitResult([ShapeOutcome(shape, error=f"tuned kernel: {error}", vendor=vendor)])
        result = ShapeOutcome(
            shape,
            latency_s=seconds,
            vendor=vendor,
            config=config_record(gemm, best.config, ctx.target.arch or "", ctx.workload.op),
            config_latency_s=best.measured_s,
            provenance={"tuner": "pipeline", "search": mode, "gpu": gpu.name, **outcome.quality()},
        )
        if ctx.settings.publish_only_faster_than_vendor and seconds >= vendor.seconds:
            result.not_published = (
                f"the vendor is faster, kernel only ({vendor.seconds * 1e6:.1f} µs vs {seconds * 1e6:.1f} µs)"
            )
        return UnitResult([result])

    def describe_config(self, config: Mapping[str, Any]) -> str:
        """A pipeline candidate in one line, e.g. '64x64x16/4x4/s4a/r2f' (tiles/thread tile/shared stages,
        a = cp.async/register stages, f = fused)."""
        from service.tuning.tuners.pipeline.space import PipelineConfig

        try:
            return PipelineConfig.from_dict(config["config"]).key
        except (KeyError, TypeError):
            return str(config.get("format", "config"))


def search_mode(tags: Mapping[str, str]) -> Mode:
    """The job's search from its `pipeline_search` tag: "anal+xgb" (default) or "analytical"."""
    from service.tuning.tuners.pipeline.tuner import MODES

    value = tags.get(SEARCH_TAG, MODES[0])
    for mode in MODES:
        if value == mode:
            return mode
    raise ValueError(f"tag {SEARCH_TAG}={value!r}: the search is one of {', '.join(MODES)}")


def config_record(gemm: GemmShape, config: PipelineConfig, arch: str, op: str = "") -> dict[str, Any]:
    """A published pipeline config: self-describing, so later jobs calibrate the model from it."""
    record = {
        "format": CONFIG_FORMAT,
        "arch": arch,
        "gemm": {"batch": gemm.batch, "m": gemm.m, "n": gemm.n, "k": gemm.k, "dtype": gemm.dtype},
        "config": config.to_dict(),
    }
    if op == "conv2d":  # the kernel's contract with its caller: packed filter in, NHWC out
        record["layout"] = {"filter": "W[CO, KH*KW*CI] = F.transpose(3, 0, 1, 2)", "output": "O[N*OH*OW, CO]"}
    return record


def candidate(
    gemm: GemmShape, config: PipelineConfig, seconds: float, error: str | None, predicted_s: float | None = None
) -> MeasuredCandidate:
    """A measured proposal as the store keeps it; candidates are recorded in proposal order, with the model's
    prediction, so best-in-top-k and the rank correlation can be recomputed for any job."""
    ok = math.isfinite(seconds)
    record = config_record(gemm, config, "")
    if predicted_s is not None and math.isfinite(predicted_s):
        record["predicted_s"] = predicted_s
    return MeasuredCandidate(
        config=record,
        latency_s=seconds if ok else None,
        status="ok" if ok else "error",
        error=None if ok else (error or "failed"),
    )


def earlier_measurements(candidates: Sequence[MeasuredCandidate]) -> tuple[tuple[PipelineConfig, float], ...]:
    """(configuration, seconds; inf where it failed) of the pipeline candidates a killed attempt recorded, in
    the order it measured them: the retry's search starts from them instead of measuring them again."""
    from service.tuning.tuners.pipeline.space import PipelineConfig

    out = []
    for c in candidates:
        if isinstance(c.config, dict) and c.config.get("format") == CONFIG_FORMAT:
            out.append((PipelineConfig.from_dict(c.config["config"]), float(c.latency_s or math.inf)))
    return tuple(out)


def calibration_samples(candidates: Sequence[MeasuredCandidate]) -> list[Sample]:
    """(GEMM, configuration, seconds) of the pipeline kernels among `candidates` (what this target measured)."""
    from service.tuning.tuners.pipeline.space import GemmShape, PipelineConfig

    out = []
    for c in candidates:
        config, latency = c.config, c.latency_s
        if isinstance(config, dict) and config.get("format") == CONFIG_FORMAT and latency:
            out.append((GemmShape(**config["gemm"]), PipelineConfig.from_dict(config["config"]), float(latency)))
    return out


def gpu_constants(target: TargetSpec, samples: list[Sample], min_samples: int = 16) -> GPUConstants:
    """The arch's model constants, fitted to what this target measured once there is enough of it."""
    from service.tuning.tuners.pipeline.model import GPUConstants, calibrate

    gpu = GPUConstants.for_arch(target.arch or "")
    details = target.details or {}
    # the worker's detected part (an H100 PCIe has 114 SMs, not the SXM's 132) replaces the arch's defaults
    sm_count, l2 = details.get("sm_count"), details.get("l2_bytes")
    gpu = gpu.with_hardware(int(sm_count) if sm_count else None, int(l2) if l2 else None)
    if len(samples) < min_samples:
        return gpu
    fitted, before, after = calibrate(gpu, samples)
    log.info("pipeline model calibrated on %d kernels: log error %.3f → %.3f", len(samples), before, after)
    return fitted
