"""The SDK's epilogues in numpy: erf without scipy, every activation against its float64 definition."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from kernelfleet.dispatch import DispatchTable, Interval, Shape
from kernelfleet.epilogue import ACTIVATIONS, NO_EPILOGUE, Epilogue, activate, dense_reference, erf


def _exact(y: np.ndarray, activation: str) -> np.ndarray:
    """float64 definitions (math.erf, math.tanh), elementwise: the ground truth without torch or scipy."""
    fn: Callable[[float], float] = {
        "none": lambda v: v,
        "relu": lambda v: max(v, 0.0),
        "gelu": lambda v: 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))),
        "gelu_tanh": lambda v: 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3))),
        "silu": lambda v: v / (1.0 + math.exp(-v)) if v > -700 else 0.0,
    }[activation]
    return np.array([fn(float(v)) for v in y.ravel()]).reshape(y.shape)


def test_erf_is_within_abramowitz_stegun_bounds() -> None:
    x = np.linspace(-6.0, 6.0, 20001)
    exact = np.array([math.erf(v) for v in x])
    assert np.abs(erf(x) - exact).max() <= 1.5e-7
    x32 = x.astype(np.float32)
    got = erf(x32)
    assert got.dtype == np.float32 and np.abs(got - exact).max() <= 1e-6  # computed in fp32: a few ulps
    assert abs(erf(np.zeros(1))[0]) <= 1.5e-7 and np.all(erf(-x) == -erf(x))  # odd, like erf


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_every_activation_matches_its_definition_in_fp32(activation: str) -> None:
    y = np.concatenate([np.linspace(-12, 12, 4001), [-1e4, -100.0, 0.0, 100.0, 1e4]]).astype(np.float32)
    got = activate(y.copy(), activation)
    assert got.dtype == np.float32
    exact = _exact(y, activation)
    np.testing.assert_allclose(got, exact, rtol=2e-6, atol=2e-6)


def test_dense_reference_adds_the_bias_then_activates() -> None:
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((5, 8)), rng.standard_normal((3, 8)), rng.standard_normal(3)
    np.testing.assert_allclose(dense_reference(x, w), x @ w.T)
    np.testing.assert_allclose(dense_reference(x, w, b, Epilogue(True, "relu")), np.maximum(x @ w.T + b, 0))
    with pytest.raises(ValueError, match="bias="):
        dense_reference(x, w, None, Epilogue(True, "none"))


def test_epilogues_validate_and_tables_without_one_serialize_as_before() -> None:
    with pytest.raises(ValueError, match="gelu_tanh"):
        Epilogue(False, "tanh")
    assert NO_EPILOGUE.trivial and not Epilogue(False, "relu").trivial
    old = {"mts": {"a": 4}, "intervals": [[1, 8, [[], "a"]], [9, 16, "vendor"]]}  # a table signed before epilogues
    table = DispatchTable.from_dict(old)
    assert table.epilogue == NO_EPILOGUE and table.to_dict() == old  # the same bytes: its signature verifies
    fused = DispatchTable((Interval(1, 8, Shape((), "a")),), {"a": 4}, Epilogue(True, "silu"))
    assert fused.to_dict()["epilogue"] == {"bias": True, "activation": "silu"}
    assert DispatchTable.from_dict(fused.to_dict()) == fused
