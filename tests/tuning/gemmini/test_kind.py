"""The `gemmini` job kind tunes a layer list through the platform's real ZigZag backend."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from service.api.dashboard import panels
from service.models import Budget, TargetSpec, Workload
from service.models.distribution import Explicit, ShapePoint
from service.settings import Settings
from service.tuning.admission import check_job
from service.tuning.gemmini.backends.spike import SpikeNotInstalled, SpikeTools
from service.tuning.kinds import KINDS
from service.tuning.kinds.base import UnitContext
from service.tuning.platforms import PLATFORMS
from tests.tuning.gemmini.firesim_fake import make_fake_checkout
from tests.tuning.sinks import RecordingSink


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
    sink = RecordingSink()
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
        # one objective: the search optimised the model fitted to ZigZag on a sample of this job's families
        fitted = outcome.provenance["calibration"]["objective"]
        assert fitted["backend"].startswith("zigzag") and fitted["points"] > 0
        assert {"gemm WS", "gemm OS"} <= set(fitted["families"])
    hw = {o.config["hw"]["dim"] for o in result.shapes if o.config}
    assert len(hw) == 1  # one hardware config shared by the whole list
    edp = result.shapes[0].provenance["network_edp"]
    assert edp["tuned"] < edp["default"]  # ZigZag agrees the co-tuned point beats Gemmini-Default
    # one objective (issue 36 item 3): the model's best few configs measured by ZigZag; the winner is its best
    shortlist = result.shapes[0].provenance["shortlist"]
    # each round's 4 best, the search's start and the default as gemmini.h tiles it
    assert 1 < len(shortlist) <= 2 * 4 + 2 and shortlist[0]["hw"] == result.shapes[0].config["hw"]
    assert shortlist[0]["measured_edp"] == edp["tuned"] == min(s["measured_edp"] for s in shortlist)
    measured, explored = sink.candidates[:4], sink.candidates[4:]
    assert [c.config["backend"] for c in measured] == ["zigzag"] * 4
    assert [c.config["role"] for c in measured] == ["chosen", "default"] * 2  # the dashboard marks both
    # every hardware config the search visited, at its best network point, labelled as the model's estimate
    assert explored and {c.config["role"] for c in explored} == {"explored"}
    assert {c.config["backend"] for c in explored} == {"model"}
    assert len({str(c.config["hw"]) for c in explored}) == len(explored)  # one point per hardware config
    # what it publishes is what /v1/configs/import accepts for this kind, and a broken one is refused
    assert all(kind.check_config(o.config) is None for o in result.shapes if o.config)
    broken = {**result.shapes[0].config, "measured_cycles": -1} if result.shapes[0].config else {}
    problem = kind.check_config(broken)
    assert problem is not None and problem.loc == ("measured_cycles",)
    assert plan.trials_total == 800 + 4
    # Spike in the loop (issue 36 item 5): the winner's and the default's programs, functional only
    spike = result.shapes[0].provenance["spike"]
    try:
        SpikeTools.from_env()
        assert spike["winner"]["status"] == spike["default"]["status"] == "passed", spike
        assert all("timing" not in c and "cycles" not in c for c in spike["winner"]["checks"])
    except SpikeNotInstalled as exc:
        assert spike == {"winner": {"status": f"not run: {exc}"}, "default": {"status": f"not run: {exc}"}}
    # what the dashboard's latency/energy scatter reads from these candidates
    now = dt.datetime.now(dt.UTC)
    points = panels.energy_points(
        [
            panels.CandidatePoint(i, "M", c.config, c.latency_s, c.status, None, now)
            for i, c in enumerate(sink.candidates)
        ]
    )
    assert sorted(p.role for p in points if p.role != "explored") == ["chosen", "chosen", "default", "default"]
    assert sum(p.role == "explored" for p in points) == len(explored)
    assert all(p.energy_j > 0 and p.latency_s > 0 for p in points)


def test_platform_serves_the_backend_the_worker_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from service.tuning.platforms.gemmini import GemminiPlatform

    monkeypatch.setenv("KERNELFLEET_GEMMINI_BACKEND", "firesim")
    monkeypatch.setenv("KERNELFLEET_FIRESIM_DIR", str(tmp_path / "firesim"))
    assert GemminiPlatform().detect() is None  # no FireSim checkout: this host is no FireSim worker
    why = GemminiPlatform().mismatch(TargetSpec(kind="gemmini", arch="default"))
    assert why is not None and "deploy/ missing" in why
    make_fake_checkout(tmp_path / "firesim")
    target = GemminiPlatform().detect()
    assert target is not None and target.details["backend"] == "firesim"
    assert GemminiPlatform().queue(target) == "firesim"


def test_gemmini_kind_rejects_what_it_cannot_tune() -> None:
    target = TargetSpec(kind="gemmini", arch="default")
    dist = Explicit(points=[ShapePoint(shape={"B": 2}, weight=1)])
    bmm = Workload(op="batch_matmul", dims={"M": 8, "N": 8, "K": 8}, symbolic=["B"], workload_hash="b")
    problem = check_job("gemmini", bmm, dist, target, Budget(trials=100))
    assert problem is not None and problem.loc == ("workload", "op")


def test_gemmini_kind_on_the_fake_firesim_tunes_mappings_on_configs_with_bitstreams(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the firesim backend the hardware is what has bitstreams; the numbers come from the FAKE CLI."""
    from service.tuning.gemmini.backends.firesim import BitstreamRegistry
    from service.tuning.gemmini.space import DEFAULT_HW, HwConfig
    from service.tuning.platforms.gemmini import GemminiPlatform

    fake = Path(__file__).parent / "fake_firesim"
    make_fake_checkout(tmp_path / "firesim")
    registry = BitstreamRegistry(tmp_path / "registry.json")
    big = HwConfig(dim=32, sp_kib=512, acc_kib=128)
    for hw, name in ((DEFAULT_HW, "default_fake"), (big, "dim32_fake")):
        (tmp_path / f"{name}.tar.gz").write_text("FAKE bitstream")
        registry.register(hw, name, str(tmp_path / f"{name}.tar.gz"))
    for key, value in {
        "KERNELFLEET_GEMMINI_BACKEND": "firesim",
        "KERNELFLEET_FIRESIM_DIR": str(tmp_path / "firesim"),
        "KERNELFLEET_FIRESIM_REGISTRY": str(registry.path),
        "KERNELFLEET_FIRESIM_BUILD": f"{fake / 'fake_riscv_build'} {{src}} {{out}}",
    }.items():
        monkeypatch.setenv(key, value)
    platform = GemminiPlatform()
    workload = Workload(op="dense", symbolic=["M", "N", "K"], workload_hash="w")
    dist = Explicit(points=[ShapePoint(shape={"M": 128, "N": 256, "K": 256}, weight=2)])
    target = TargetSpec(kind="gemmini", arch="default")
    kind = KINDS.get("gemmini")
    (unit,) = kind.plan(workload, dist, Budget(trials=200)).units
    sink = RecordingSink()
    ctx = UnitContext(
        job_id="j",
        worker="w",
        workload=workload,
        target=platform.resolve(target),
        platform=platform,
        distribution=dist,
        budget=Budget(trials=200),
        settings=Settings(),
        work_dir=tmp_path,
        sink=sink,
    )
    result = kind.run_unit(unit, ctx)
    assert result.fatal is None
    (outcome,) = result.shapes
    assert outcome.config is not None and outcome.config["backend"] == "firesim"
    assert HwConfig(**outcome.config["hw"]) in (DEFAULT_HW, big)  # never a config without a bitstream
    assert outcome.vendor is not None and "by firesim" in outcome.vendor.label
    assert outcome.provenance["hardware_choices"] == 2
    assert outcome.provenance["network_edp"]["tuned"] is None  # FireSim gives cycles, not energy
    assert {c.config["role"] for c in sink.candidates} == {"chosen", "default", "explored"}
