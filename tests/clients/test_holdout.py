"""The A/B holdout (kernelfleet.holdout) in a Dispatcher: which calls run the baseline, what both sides sum, what
telemetry carries; and that a dispatcher holding nothing out keeps its class (its hot path)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kernelfleet import vendor
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.epilogue import Epilogue
from kernelfleet.holdout import Holdout
from kernelfleet.telemetry import usage_records

META = {"workload_hash": "ab" * 16, "target_fingerprint": "cd" * 16, "dim": "M"}


def test_one_call_in_every_runs_the_baseline_from_the_second_call_at_each_shape() -> None:
    clock = itertools.count(0.0, 0.5)  # every call takes 0.5 s on this clock
    holdout = Holdout(4, "torch")
    ran = [holdout.run(S, lambda: "served", lambda: "baseline", lambda: next(clock)) for S in [7] * 9 + [3] * 2]
    assert ran[:9] == ["served"] * 3 + ["baseline"] + ["served"] * 3 + ["baseline", "served"]
    assert ran[9:] == ["served", "served"]  # S = 3's first call is not a sample; its second is served
    samples = holdout.samples(reset=True)
    assert (samples[7].baseline_calls, samples[7].served_calls) == (2, 6)
    assert samples[7].baseline_s == pytest.approx(1.0) and samples[7].served_s2 == pytest.approx(6 * 0.25)
    assert (samples[3].baseline_calls, samples[3].served_calls) == (0, 1)
    assert holdout.samples() == {}
    with pytest.raises(ValueError, match="every"):
        Holdout(1, "numpy")


def test_a_dispatcher_holding_out_computes_the_same_and_reports_both_sides() -> None:
    epilogue = Epilogue(True, "relu")
    d = Dispatcher(None, {}, N=None, K=None, source="fallback", meta=META, epilogue=epilogue)
    assert type(d) is Dispatcher and d.holdout is None
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((8, 4), dtype=np.float32), rng.standard_normal(8, dtype=np.float32)
    x = rng.standard_normal((5, 4), dtype=np.float32)
    want = np.maximum(x @ w.T + b, 0)
    d.hold_out(2, vendor.TORCH if vendor.has_torch() else vendor.NUMPY)
    assert isinstance(d, Dispatcher) and d.library(5) == d.baseline  # no table: the host's baseline runs
    for _ in range(7):
        np.testing.assert_allclose(d(x, w, bias=b), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        d(np.ones(4, np.float32), w, bias=b)  # refused as before (not [S, K])
    [record] = usage_records(d)
    assert record["calls"] == 7 and record["fallbacks"] == 7 and "table_job_id" not in record
    held = record["holdout"]
    assert held["baseline"] == d.baseline and held["baseline_calls"] == 3 and held["served_calls"] == 3
    assert held["served_s"] > 0 and held["baseline_s2"] > 0
    assert usage_records(d) == []  # reset


def test_a_dispatcher_refuses_an_unknown_baseline() -> None:
    d = Dispatcher(None, {}, N=None, K=None, meta=META)
    with pytest.raises(ValueError, match="baseline"):
        d.hold_out(10, "mkl")
    assert type(d) is Dispatcher
