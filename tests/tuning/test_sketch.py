"""Sketch search with real MetaSchedule on tiny budgets; the stored config rebuilds to a correct kernel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernelfleet.tvm_kernel import build_kernel
from service.models import WorkloadSpec
from service.models.config import MeasuredCandidate
from service.tuning.compute import random_inputs, reference, tolerance
from service.tuning.hardware import host_target
from service.tuning.tuners.base import TuningStopped
from service.tuning.tuners.sketch import SketchTask, SketchTuner

pytestmark = pytest.mark.slow


class ListSink:
    def __init__(self, stop_after: int | None = None) -> None:
        self.candidates: list[MeasuredCandidate] = []
        self.stop_after = stop_after

    def on_candidates(self, candidates: list[MeasuredCandidate]) -> None:
        self.candidates.extend(candidates)

    def should_stop(self) -> bool:
        return self.stop_after is not None and len(self.candidates) >= self.stop_after


@pytest.mark.parametrize(
    ("workload", "shape"),
    [
        (WorkloadSpec(op="dense", dims={"N": 32, "K": 64}, symbolic=["M"]), {"M": 13}),
        (WorkloadSpec(op="batch_matmul", dims={"B": 2, "N": 16, "K": 32}, symbolic=["M"]), {"M": 8}),
    ],
    ids=["dense", "batch_matmul"],
)
def test_tuned_config_rebuilds_and_matches_numpy(workload: WorkloadSpec, shape: dict[str, int], tmp_path: Path) -> None:
    sink = ListSink()
    outcome = SketchTuner().tune(SketchTask(workload, shape, host_target(), trials=4, work_dir=tmp_path, seed=0), sink)
    assert outcome.measured == len(sink.candidates) >= 4
    ok = [c for c in sink.candidates if c.status == "ok"]
    assert ok and outcome.best_config is not None and outcome.best_latency_s is not None
    assert outcome.best_latency_s == pytest.approx(min(c.latency_s for c in ok if c.latency_s), rel=1e-6)
    assert all(c.config["trace"] for c in sink.candidates)
    kernel = build_kernel(outcome.best_config)  # as an inference host would, from the stored JSON only
    inputs = random_inputs(workload, shape, seed=3)
    assert float(np.abs(kernel(*inputs) - reference(workload)(*inputs)).max()) <= tolerance(workload, shape)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # the work dir is cleaned up


def test_sink_can_stop_the_search(tmp_path: Path) -> None:
    workload = WorkloadSpec(op="dense", dims={"N": 16, "K": 16}, symbolic=["M"])
    sink = ListSink(stop_after=1)
    with pytest.raises(TuningStopped):
        SketchTuner().tune(SketchTask(workload, {"M": 4}, host_target(), trials=32, work_dir=tmp_path), sink)
    assert 1 <= len(sink.candidates) < 32


def test_crashing_and_hanging_candidates_fail_only_themselves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.faults import crash_or_hang_evaluator

    monkeypatch.setenv("KF_TEST_FAULTS", str(tmp_path / "calls"))
    workload = WorkloadSpec(op="dense", dims={"N": 16, "K": 16}, symbolic=["M"])
    sink = ListSink()
    task = SketchTask(
        workload, {"M": 4}, host_target(), trials=9, work_dir=tmp_path / "wd", seed=0, measure_timeout_s=4
    )
    outcome = SketchTuner(run_evaluator=crash_or_hang_evaluator).tune(task, sink)
    statuses = [c.status for c in sink.candidates]
    assert "error" in statuses and "timeout" in statuses and "ok" in statuses, statuses
    assert all(c.error for c in sink.candidates if c.status != "ok")
    assert outcome.best_config is not None  # the search went on and kept the good ones
    assert outcome.errors == statuses.count("error") + statuses.count("timeout")
