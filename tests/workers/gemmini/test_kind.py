"""The `gemmini` job kind tunes a layer list through the platform's real ZigZag backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.models import Budget, TargetSpec, Workload
from service.models.config import MeasuredCandidate
from service.models.distribution import Explicit, ShapePoint
from service.settings import Settings
from service.workers.kinds import KINDS, check_job
from service.workers.kinds.base import UnitContext
from service.workers.platforms import PLATFORMS


class _Sink:
    def __init__(self) -> None:
        self.candidates: list[MeasuredCandidate] = []

    def on_candidates(self, unit_key: str, candidates: list[MeasuredCandidate]) -> None:
        self.candidates += candidates

    def on_progress(self, shape_key: str | None, trials: int) -> None:
        pass

    def earlier_candidates(self, unit_key: str) -> list[MeasuredCandidate]:
        return []

    def should_stop(self) -> bool:
        return False


def test_gemmini_kind_cotunes_a_weighted_layer_list_measured_by_zigzag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KERNELFLEET_GEMMINI_BACKEND", "zigzag")
    platform: Any = PLATFORMS.get("gemmini")
    why = platform.backend.available()
    if why:
        pytest.skip(why)
    workload = Workload(op="dense", symbolic=["M", "N", "K"], workload_hash="w")
    dist = Explicit(
        points=[
            ShapePoint(shape={"M": 128, "N": 256, "K": 256}, weight=4),
            ShapePoint(shape={"M": 1, "N": 512, "K": 512}, weight=1),
        ]
    )
    target = TargetSpec(kind="gemmini", arch="default")
    kind = KINDS.get("gemmini")
    assert check_job("gemmini", workload, dist, target, Budget(trials=800)) is None
    plan = kind.plan(workload, dist, Budget(trials=800))
    (unit,) = plan.units
    sink = _Sink()
    ctx = UnitContext(
        job_id="j",
        worker="w",
        workload=workload,
        target=platform.resolve(target),
        platform=platform,
        distribution=dist,
        budget=Budget(trials=800, seed=1),
        settings=Settings(),
        work_dir=tmp_path,
        sink=sink,
    )
    result = kind.run_unit(unit, ctx)
    assert result.fatal is None and len(result.shapes) == 2
    for outcome in result.shapes:
        assert outcome.config and outcome.config["backend"] == "zigzag"
        assert outcome.vendor and "by zigzag" in outcome.vendor.label
        assert outcome.latency_s and outcome.latency_s > 0
        assert outcome.provenance["calibration"]["backend"] == "zigzag"
    hw = {o.config["hw"]["dim"] for o in result.shapes if o.config}
    assert len(hw) == 1  # one hardware config shared by the whole list
    edp = result.shapes[0].provenance["network_edp"]
    assert edp["tuned"] < edp["default"]  # ZigZag agrees the co-tuned point beats Gemmini-Default
    assert [c.config["backend"] for c in sink.candidates] == ["zigzag", "zigzag"]


def test_gemmini_kind_rejects_what_it_cannot_tune() -> None:
    target = TargetSpec(kind="gemmini", arch="default")
    dist = Explicit(points=[ShapePoint(shape={"B": 2}, weight=1)])
    bmm = Workload(op="batch_matmul", dims={"M": 8, "N": 8, "K": 8}, symbolic=["B"], workload_hash="b")
    problem = check_job("gemmini", bmm, dist, target, Budget(trials=100))
    assert problem is not None and problem.loc == ("workload", "op")
