"""The ukernel range tuner on this host, without Celery or the store: rules → uKernels → table → verified."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.models import WorkloadSpec
from service.tuning.hardware import host_target
from service.tuning.kinds.ukernel import verification_shapes, verify
from service.tuning.tuners.base import TuningStopped
from service.tuning.tuners.ukernel.tuner import QuietRangeSink, RangeTask, UKernelTuner

WORKLOAD = WorkloadSpec(op="dense", dims={"N": 64, "K": 32}, symbolic=["M"])


class Sink(QuietRangeSink):
    def __init__(self, stop: bool = False) -> None:
        self.validated: list[int] = []
        self.stop = stop

    def on_validated(self, S: int, measured: int) -> None:
        self.validated.append(S)

    def should_stop(self) -> bool:
        return self.stop


def _task(tmp_path: Path, **kw: object) -> RangeTask:
    args: dict[str, object] = dict(
        workload=WORKLOAD, s_max=128, validate=[128, 13], target=host_target(), max_ukernels=3, work_dir=tmp_path
    )
    args.update(kw)
    return RangeTask(min_repeat_ms=2, **args)  # type: ignore[arg-type]


def test_one_tuning_covers_the_range_and_every_program_matches_numpy(tmp_path: Path) -> None:
    sink = Sink()
    out = UKernelTuner().tune(_task(tmp_path), sink)
    assert sink.validated == [128, 13]
    assert out.table.intervals[0].lo == 1 and out.table.s_max == 128 and len(out.predicted_s) == 128
    assert set(out.kernels) == set(out.artifacts) == set(out.table.mts)  # only used uKernels ship
    for uid, art in out.artifacts.items():
        assert art.path.name == f"{art.sha256}.so" and art.spec == out.kernels[uid].spec
    shapes = verification_shapes(out)
    assert set(range(1, 129)) <= set(shapes) and {131, 257} <= set(shapes)  # every T, then primes past the range
    assert verify(out, WORKLOAD) is None  # the dispatcher against numpy at each of those shapes
    assert set(out.measured_s) == {128, 13} and all(t > 0 for t in out.measured_s.values())
    entry = out.validation["shapes"]["128"]
    assert set(entry["measured_s"]) == set(entry["dietcode_s"]) == set(entry["sia_score"])
    assert 0.0 <= out.padding_ratio < 1.0
    assert len(out.candidates) >= len(out.kernels) and all("reasons" in c for c in out.candidates)


def test_a_stop_request_stops_the_tuner(tmp_path: Path) -> None:
    with pytest.raises(TuningStopped):
        UKernelTuner().tune(_task(tmp_path), Sink(stop=True))


def test_workloads_outside_the_tuner_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="float32"):
        UKernelTuner().tune(_task(tmp_path, workload=WORKLOAD.model_copy(update={"dtype": "float16"})), Sink())
    with pytest.raises(ValueError, match="s_max"):
        UKernelTuner().tune(_task(tmp_path, s_max=5000), Sink())
