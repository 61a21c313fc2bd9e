"""Sketch search (Ansor; MetaSchedule is its successor in TVM).

MetaSchedule generates sketches with the target's schedule rules (CPU or CUDA), samples and evolves them with an
XGBoost cost model, and measures candidates in separate processes (its LocalBuilder/LocalRunner),
so a candidate that crashes or hangs fails only itself. The builder, the runner and the build options
come from the target's platform (service.tuning.platforms). Every measured candidate is streamed to
the sink; the best is returned as a portable trace plus the IRModule it applies to.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import tvm
import tvm_ffi
from tvm import s_tir
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.arg_info import ArgInfo
from tvm.s_tir.meta_schedule.measure_callback import MeasureCallback, PyMeasureCallback

from kernelfleet.tvm_kernel import CONFIG_FORMAT_TRACE
from service.models import TargetSpec, WorkloadSpec
from service.models.config import MeasuredCandidate
from service.tuning.compute import prim_func
from service.tuning.platforms import TVMPlatform, platform_for, tvm_target
from service.tuning.tuners import tensor_intrinsics
from service.tuning.tuners.base import StopSignal, TuningStopped
from service.tuning.tuners.trace_json import FAILED_RUN_SECS, to_py

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SketchTask:
    workload: WorkloadSpec
    shape: dict[str, int]
    target: TargetSpec
    trials: int
    work_dir: Path
    seed: int | None = None
    measure_timeout_s: int = 30
    # What earlier attempts of the same job measured for this task: a retry counts them against `trials` and
    # searches on from them instead of starting over.
    resume_from: tuple[MeasuredCandidate, ...] = ()


@dataclass
class SketchOutcome:
    best_config: dict[str, Any] | None
    best_latency_s: float | None
    measured: int
    errors: int
    extra: dict[str, Any] = field(default_factory=dict)


class CandidateSink(StopSignal, Protocol):
    def on_candidates(self, candidates: list[MeasuredCandidate]) -> None: ...


def _batch_size(trials: int) -> int:
    """Candidates per search round: small budgets still get several cost-model updates (and prompt cancels)."""
    return min(32, max(8, trials // 4))


def _classify(error: str | None) -> str:
    if error is None:
        return "ok"
    return "timeout" if "timeout" in error.lower() else "error"


def _make_recorder(sink: CandidateSink) -> Any:
    @derived_object
    class _Recorder(PyMeasureCallback):  # type: ignore[misc]
        """Streams each measured batch to the sink; stops the search when the sink says so."""

        def apply(self, task_scheduler: Any, task_id: int, candidates: Any, builds: Any, runs: Any) -> None:
            batch = []
            for cand, build, run in zip(candidates, builds, runs, strict=True):
                error = build.error_msg or (run.error_msg if run is not None else "not run")
                secs = [float(s) for s in (run.run_secs or [])] if run is not None and not error else []
                latency = sum(secs) / len(secs) if secs else None
                if latency is not None and latency >= FAILED_RUN_SECS:
                    error, latency = "measurement failed", None
                batch.append(
                    MeasuredCandidate(
                        config={"format": CONFIG_FORMAT_TRACE, "trace": to_py(cand.sch.trace.as_json())},
                        latency_s=latency,
                        status=_classify(error),  # type: ignore[arg-type]
                        error=None if error is None else str(error)[-2000:],
                    )
                )
            sink.on_candidates(batch)
            if sink.should_stop():
                raise TuningStopped("stopped by the job")

    return _Recorder()


def drop_unnamed_ms_handlers() -> None:
    """MetaSchedule rebuilds its logging config from the names of its logger's handlers and crashes on an
    unnamed one (`None.format`), e.g. a capture handler a host application or pytest attached."""
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    for handler in list(ms_logger.handlers):
        if handler.get_name() is None:
            ms_logger.removeHandler(handler)


class SketchTuner:
    """`run_evaluator` replaces MetaSchedule's timing function inside the measuring process
    (`LocalRunner(f_run_evaluator=...)`); it must be importable by name. The fault tests use it."""

    name = "sketch"

    def __init__(self, run_evaluator: Callable[..., list[float]] | None = None) -> None:
        self.run_evaluator = run_evaluator

    def tune(self, task: SketchTask, sink: CandidateSink) -> SketchOutcome:
        mod = prim_func(task.workload, task.shape)
        target_dict = tvm_target(task.target)
        target = tvm.target.Target(target_dict)
        work_dir = task.work_dir
        work_dir.mkdir(parents=True, exist_ok=True)
        earlier = task.resume_from[: task.trials]
        counts = {"measured": len(earlier), "errors": sum(c.status != "ok" for c in earlier)}
        database = resumed_database(mod, target, earlier)

        class _Counting:
            def on_candidates(self, cands: list[MeasuredCandidate]) -> None:
                counts["measured"] += len(cands)
                counts["errors"] += sum(c.status != "ok" for c in cands)
                sink.on_candidates(cands)

            def should_stop(self) -> bool:
                return sink.should_stop()

        recorder = _make_recorder(_Counting())
        platform = platform_for(task.target)
        assert isinstance(platform, TVMPlatform), f"{task.target.kind} targets are not compiled by TVM"
        runner = platform.metaschedule_runner(task.measure_timeout_s, self.run_evaluator)
        drop_unnamed_ms_handlers()
        remaining = task.trials - len(earlier)
        tensor_intrinsics.load()  # what the TuneContext would import, in 2 s rather than 20-60 s
        try:
            if remaining > 0:  # else an earlier attempt measured the whole budget: pick from what it measured
                ms.tune_tir(
                    mod,
                    target,
                    str(work_dir / "ms"),
                    max_trials_global=remaining,
                    num_trials_per_iter=_batch_size(task.trials),
                    builder=platform.metaschedule_builder(),
                    runner=runner,
                    database=database,
                    cost_model="xgb",
                    seed=task.seed,
                    measure_callbacks=[*MeasureCallback.create("default"), recorder],
                )
        except Exception:
            # TVM's FFI re-raises the callback's TuningStopped as a RuntimeError; restore its meaning
            if sink.should_stop():
                raise TuningStopped("stopped by the job") from None
            raise
        finally:
            shutil.rmtree(work_dir, ignore_errors=True)
        record = database.query_tuning_record(mod, target, workload_name="main")
        if record is None or not record.run_secs:
            return SketchOutcome(None, None, counts["measured"], counts["errors"])
        latency = sum(float(s) for s in record.run_secs) / len(record.run_secs)
        if latency >= FAILED_RUN_SECS:
            return SketchOutcome(None, None, counts["measured"], counts["errors"])
        config = {
            "format": CONFIG_FORMAT_TRACE,
            "trace": to_py(record.trace.as_json()),
            "module": tvm.ir.save_json(mod),
            "module_hash": str(tvm_ffi.structural_hash(mod)),
            "target": target_dict,
        }
        options = platform.pass_config(task.target)
        if options:  # e.g. async copies on CUDA: the SDK must build the kernel as it was measured
            config["pass_config"] = options
        return SketchOutcome(config, latency, counts["measured"], counts["errors"])


def resumed_database(mod: Any, target: Any, earlier: Sequence[MeasuredCandidate]) -> Any:
    """A MetaSchedule database holding the measured candidates of earlier attempts, each as a tuning record of
    `mod`: the evolutionary search starts its population from the best of them, and the best config may be one.
    A trace that no longer replays on the module is left out (it still counts against the budget)."""
    database = ms.database.MemoryDatabase()
    if not earlier:
        return database
    workload = database.commit_workload(mod)
    args_info = ArgInfo.from_prim_func(mod["main"])
    for candidate in earlier:
        if candidate.status != "ok" or candidate.latency_s is None:
            continue
        sch = s_tir.Schedule(mod)
        try:
            s_tir.Trace.apply_json_to_schedule(candidate.config["trace"], sch)
        except Exception as exc:  # TVM raises its own error types for a trace that does not apply
            log.warning("an earlier candidate's trace does not replay: %s", exc)
            continue
        database.commit_tuning_record(
            ms.database.TuningRecord(sch.trace, workload, [candidate.latency_s], target, args_info)
        )
    return database


def sample_candidates(mod: Any, target_dict: dict[str, object], count: int, seed: int = 0) -> list[Any]:
    """`count` post-processed MetaSchedule candidates (schedules) for `mod`, drawn without measuring.

    What the search would hand the builder in its first round (random cost model): used to check that
    a platform's candidates compile (e.g. CUDA codegen + nvcc on a host without a GPU)."""
    target = tvm.target.Target(target_dict)
    tensor_intrinsics.load()
    ctx = ms.TuneContext(
        mod=mod,
        target=target,
        space_generator="post-order-apply",
        search_strategy="evolutionary",
        task_name="main",
        num_threads=1,
        rand_state=seed,
    )
    spaces = ctx.generate_design_space()
    ctx.pre_tuning(
        max_trials=count,
        num_trials_per_iter=count,
        design_spaces=spaces,
        database=ms.database.MemoryDatabase(),
        cost_model=ms.cost_model.RandomModel(),
    )
    candidates = ctx.generate_measure_candidates() or []
    ctx.post_tuning()
    return [c.sch for c in candidates]
