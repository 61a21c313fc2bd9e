"""A sketch search resumed from an earlier attempt's candidates counts them against its budget (issue 34 item 7).

The whole retry through a killed Celery worker is tests/workers/test_killed_attempts.py; this is the tuner's part
when the killed attempt had measured the whole budget: nothing is measured again, and the best of what was
measured is the outcome, as the SDK will rebuild it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernelfleet.tvm_kernel import build_kernel
from service.models import WorkloadSpec
from service.models.config import MeasuredCandidate
from service.tuning.compute import random_inputs, reference, tolerance
from service.tuning.hardware import host_target
from service.tuning.tuners.sketch import SketchTask, SketchTuner

pytestmark = pytest.mark.slow

WORKLOAD = WorkloadSpec(op="dense", dims={"N": 32, "K": 32}, symbolic=["M"])
SHAPE = {"M": 8}


def _measured(factor: int, latency_s: float | None) -> MeasuredCandidate:
    """A candidate as the sketch tuner records it: the trace of a schedule (the column loop split by `factor`)."""
    from tvm import s_tir

    from service.tuning.compute import prim_func
    from service.tuning.tuners.trace_json import to_py

    sch = s_tir.Schedule(prim_func(WORKLOAD, SHAPE))
    _, column, _ = sch.get_loops(sch.get_sblock("Y"))
    sch.vectorize(sch.split(column, [None, factor])[1])
    config: dict[str, Any] = {"format": "metaschedule-trace", "trace": to_py(sch.trace.as_json())}
    if latency_s is None:
        return MeasuredCandidate(config=config, latency_s=None, status="error", error="build failed")
    return MeasuredCandidate(config=config, latency_s=latency_s, status="ok")


class _Sink:
    def __init__(self) -> None:
        self.candidates: list[MeasuredCandidate] = []

    def on_candidates(self, candidates: list[MeasuredCandidate]) -> None:
        self.candidates.extend(candidates)

    def should_stop(self) -> bool:
        return False


def test_a_retry_whose_budget_was_measured_picks_the_best_of_it_and_measures_nothing(tmp_path: Path) -> None:
    earlier = (_measured(4, 3e-6), _measured(8, 1e-6), _measured(16, None))
    sink = _Sink()
    task = SketchTask(WORKLOAD, SHAPE, host_target(), trials=3, work_dir=tmp_path / "work", resume_from=earlier)
    outcome = SketchTuner().tune(task, sink)
    assert sink.candidates == []  # the budget was spent by the killed attempt
    assert (outcome.measured, outcome.errors) == (3, 1)
    assert outcome.best_latency_s == pytest.approx(1e-6)
    assert outcome.best_config is not None and outcome.best_config["trace"] == earlier[1].config["trace"]
    kernel = build_kernel(outcome.best_config)  # complete: module, hash and target, as a fresh search gives
    inputs = random_inputs(WORKLOAD, SHAPE, seed=2)
    assert float(np.abs(kernel(*inputs) - reference(WORKLOAD)(*inputs)).max()) <= tolerance(WORKLOAD, SHAPE)
    assert not (tmp_path / "work").exists()
