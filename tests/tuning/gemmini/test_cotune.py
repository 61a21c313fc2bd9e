"""Co-tuning with the backend in the loop (cotune.py): two model rounds, the second calibrated to the backend where
the first's answers were measured, and the backend's pick among both and the default. The backend is a FAKE with
a known disagreement with the model (fake_backends.py); the job kind test runs the same with ZigZag."""

from __future__ import annotations

from service.tuning.gemmini.space import DEFAULT_HW, Layer
from service.tuning.tuners.gemmini.calibration import CALIBRATION_POINTS
from service.tuning.tuners.gemmini.cotune import cotune
from tests.tuning.gemmini.fake_backends import SkewedModelBackend

LAYERS = [Layer.gemm("qkv", 128, 768, 768, weight=2), Layer.conv("c", 28, 28, 64, 64, 3, 3, padding=1)]


def test_the_winner_is_the_backends_best_of_both_rounds_and_the_default() -> None:
    backend = SkewedModelBackend()
    c = cotune(backend, LAYERS, 600, seed=1)
    edps = [m.measured_edp for m in c.candidates]
    assert None not in edps and edps == sorted(edps)  # type: ignore[type-var]
    assert c.winner is c.candidates[0]
    assert c.start.hw == DEFAULT_HW and c.start in c.candidates  # never worse than the default as gemmini.h tiles it
    assert c.winner.measured_edp is not None and c.start.measured_edp is not None
    assert c.winner.measured_edp <= c.start.measured_edp
    assert {c.first.hw, c.second.hw} <= {m.hw for m in c.candidates}  # each round's own pick was measured
    assert c.model_calls == c.first.calls + c.second.calls <= 600


def test_the_calibration_includes_the_measured_answers_of_round_one() -> None:
    backend = SkewedModelBackend()
    c = cotune(backend, LAYERS, 600, seed=0)
    n_fitted = sum(f.n for f in c.calibration.fits.values())
    sample = CALIBRATION_POINTS * 3  # gemm in WS and OS, the conv in WS
    assert n_fitted > sample  # round 1's shortlist, measured, joined the random sample
    # round 2 searched the calibrated model: its result is priced by it, not by the model as published
    assert c.second.cost.edp != c.first.cost.edp
    # every point the backend was asked for is counted: sample, both shortlists' layers in each flow, the default
    assert c.evaluations >= sample + len(LAYERS) * 2
