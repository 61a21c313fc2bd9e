"""The model calibrated to a backend per layer family and dataflow (issue 36 item 3: one objective).

The fit is checked against a backend whose disagreement with the model is known exactly (a FAKE: the model's
own terms reweighted, its cycles bent by a power law), then against ZigZag for real."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from service.tuning.gemmini.area import default_budget
from service.tuning.gemmini.backends import get_backend
from service.tuning.gemmini.model import energy_terms, flow_cost, layer_cost, network_cost
from service.tuning.gemmini.space import DEFAULT_HW, Layer, fit
from service.tuning.tuners.gemmini.calibration import (
    MIN_POINTS,
    Calibration,
    agreement,
    calibrate,
    calibration_sample,
    family,
    fit_calibration,
)
from service.tuning.tuners.gemmini.search import Limits, co_explore
from tests.tuning.gemmini.fake_backends import SkewedModelBackend

QKV = Layer.gemm("qkv", 128, 768, 768)
GEMV = Layer.gemm("gemv", 1, 1024, 1024)
CONV = Layer.conv("c3", 28, 28, 64, 64, 3, 3, padding=1)
CONV1 = Layer.conv("c1", 28, 28, 128, 512, 1, 1)


def test_families_split_by_op_shape_and_dataflow() -> None:
    assert family(QKV, "WS") == "gemm WS" and family(QKV, "OS") == "gemm OS"
    assert family(GEMV, "OS") == "gemv OS"
    assert family(CONV, "WS") == "conv WS" and family(CONV1, "WS") == "conv 1x1 WS"


def test_the_sample_covers_each_family_and_flow_with_fitting_points_within_the_limits() -> None:
    limits = Limits(buses=(128,), accept=default_budget().fits)
    points = calibration_sample([QKV, CONV], 10, seed=3, limits=limits)
    keys = [family(lay, m.flow or "") for _, lay, m in points]
    assert {k: keys.count(k) for k in set(keys)} == {"gemm WS": 10, "gemm OS": 10, "conv WS": 10}
    assert points[0][0] == DEFAULT_HW  # each family tries the default first where the limits allow it
    for hw, lay, m in points:
        assert m.flow in hw.flows(lay) and fit(hw, lay, m) is None and limits.allows(hw)
        assert hw.dma_buswidth == 128
    assert calibration_sample([QKV, CONV], 10, seed=3, limits=limits) == points  # the seed fixes it


def test_the_fit_recovers_a_known_disagreement_and_ranks_as_the_backend_does() -> None:
    backend = SkewedModelBackend()
    layers = [QKV, GEMV, CONV, CONV1]
    cal, n = calibrate(backend, layers, seed=0, per_family=30)
    assert backend.calls == 1 and n == 30 * 6  # one run: gemm and gemv in WS and OS, two conv families in WS
    for fam in ("gemm WS", "gemm OS", "conv WS", "conv 1x1 WS"):
        f = cal.fits[fam]
        assert f.cycles[1] == pytest.approx(1.05, rel=1e-6) and math.exp(f.cycles[0]) == pytest.approx(1.2, rel=1e-5)
        assert f.energy["dram"] > 1.0  # DRAM costs more than the model says, and the fit says so
    sample = calibration_sample(layers, 30, seed=0)
    errors = sorted(
        abs(cal.adjust(hw, lay, flow_cost(hw, lay, m, m.flow or "WS")).energy_pj / real.energy_pj - 1)
        for (hw, lay, m), real in zip(sample, backend.measure_points(sample), strict=True)
    )
    # the weak pull towards the model leaves a small bias where a term is a sliver of a family's energy
    assert errors[len(errors) // 2] < 0.03 and errors[-1] < 0.2
    held_out = calibration_sample(layers, 8, seed=99)
    agree = agreement(held_out, backend.measure_points(held_out), cal)
    for a in agree.values():
        assert a["log_error_calibrated"] < 0.1 < a["log_error_model"]
        assert a["spearman_calibrated"] >= a["spearman_model"]


def test_a_family_with_too_few_points_stays_uncalibrated() -> None:
    backend = SkewedModelBackend()
    points = calibration_sample([QKV], MIN_POINTS - 1, seed=0, limits=Limits(dataflows=("WS",)))
    cal = fit_calibration(points, backend.measure_points(points), backend.version())
    assert cal.fits == {}
    m = points[0][2]
    assert cal.cost(points[0][0], QKV, m) == layer_cost(points[0][0], QKV, m)  # the model, unchanged


def test_energy_weights_are_never_negative() -> None:
    """A backend that charges nothing for DRAM would pull an unconstrained fit below zero there."""
    backend = SkewedModelBackend()
    points = calibration_sample([QKV], 20, seed=1, limits=Limits(dataflows=("WS",)))
    measured = [
        replace(r, energy_pj=r.energy_pj - 1.5 * energy_terms(hw, flow_cost(hw, lay, m, "WS"))["dram"] * 1.2)
        for (hw, lay, m), r in zip(points, backend.measure_points(points), strict=True)
    ]
    measured = [r if r.energy_pj and r.energy_pj > 0 else replace(r, energy_pj=1.0) for r in measured]
    cal = fit_calibration(points, measured, "fake")
    assert all(w >= 0 for w in cal.fits["gemm WS"].energy.values())


def test_the_search_optimises_the_calibrated_objective() -> None:
    """What co-exploration returns is priced by the objective it was given, flows chosen on calibrated EDP."""
    backend = SkewedModelBackend()
    cal, _ = calibrate(backend, [QKV, CONV], seed=0)
    r = co_explore([QKV, CONV], 400, seed=0, cost=cal.cost)
    assert r.cost.edp == pytest.approx(network_cost(r.hw, [QKV, CONV], r.mappings, cal.cost).edp)
    raw = network_cost(r.hw, [QKV, CONV], r.mappings)
    assert raw.edp != pytest.approx(r.cost.edp)  # the objective is not the model's
    assert isinstance(cal, Calibration) and cal.to_dict()["backend"] == "fake-skewed-model"


def test_zigzag_calibration_brings_the_model_closer_on_held_out_convs() -> None:
    """ZigZag for real: on a 1x1 conv the model's energy is 3-4x off (issue 36 item 3); fitted on 12 points, the
    calibrated model is closer to ZigZag on 12 configs the fit did not see, and ranks them no worse."""
    zz = get_backend("zigzag", timeout_s=300)
    if zz.available():
        pytest.skip(zz.available() or "")
    limits = Limits(buses=(128,), accept=default_budget().fits)
    cal, n = calibrate(zz, [CONV1], seed=0, limits=limits)
    assert n == 12 and set(cal.fits) == {"conv 1x1 WS"}
    held_out = calibration_sample([CONV1], 12, seed=1, limits=limits)
    a = agreement(held_out, zz.measure_points(held_out), cal)[CONV1.name]
    assert a["log_error_calibrated"] < 0.5 * a["log_error_model"]
    assert a["spearman_calibrated"] >= a["spearman_model"] - 0.05
