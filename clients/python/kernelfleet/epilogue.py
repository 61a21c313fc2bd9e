"""Epilogues of a dense layer: Y = act(X·Wᵀ + bias), fused into the uKernel so a layer is one pass.

The service compiles the bias add and the activation into the kernel's store (a tile of Y is written once,
already activated); this module is the SDK's side: what a table or a kernel spec says its epilogue is, and
the numpy implementation the dispatcher runs where the vendor library serves S (or no table is known).
numpy only: `gelu` (the erf form) uses an erf polynomial instead of scipy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")
"""`gelu` is x·Φ(x) with the exact erf; `gelu_tanh` is the tanh approximation (PyTorch's approximate='tanh')."""

ACTIVATION_OPS = {"gelu": "gelu", "gelu_": "gelu", "relu": "relu", "relu_": "relu", "silu": "silu", "silu_": "silu"}
"""PyTorch (ATen) operator → activation; gelu with approximate="tanh" is `gelu_tanh`."""


@dataclass(frozen=True)
class Epilogue:
    """What follows the matrix product in the same kernel: + bias[N] (when `bias`), then the activation."""

    bias: bool = False
    activation: str = "none"

    def __post_init__(self) -> None:
        if not isinstance(self.bias, bool):
            raise ValueError(f"epilogue bias must be a bool, got {self.bias!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.activation!r}; known: {', '.join(ACTIVATIONS)}")

    @property
    def trivial(self) -> bool:
        return not self.bias and self.activation == "none"

    def to_dict(self) -> dict[str, Any]:
        return {"bias": self.bias, "activation": self.activation}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Epilogue:
        if not data:
            return NO_EPILOGUE
        return cls(bool(data.get("bias", False)), str(data.get("activation", "none")))

    @classmethod
    def of_attrs(cls, attrs: Mapping[str, Any]) -> Epilogue:
        """A dense workload's epilogue from its operator attributes."""
        return cls(bool(attrs.get("bias", False)), str(attrs.get("activation", "none")))

    def describe(self) -> str:
        parts = (["+ bias"] if self.bias else []) + ([self.activation] if self.activation != "none" else [])
        return ", ".join(parts) or "none"


NO_EPILOGUE = Epilogue()

# Abramowitz & Stegun 7.1.26: |erf(x) − approx| ≤ 1.5e-7 for every x ≥ 0 (odd extension below 0); the uKernels'
# fused erf (service/tuning/epilogue.py) uses the same coefficients
ERF_P = 0.3275911
ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)  # a1..a5
_SQRT_2_OVER_PI = 0.7978845608028654


def erf(x: np.ndarray) -> np.ndarray:
    """erf elementwise, within 1.5e-7 absolute (fp32 rounding is ~6e-8 at 1): no scipy needed."""
    a = np.abs(x)
    t = 1.0 / (1.0 + ERF_P * a)
    poly = t * (ERF_A[0] + t * (ERF_A[1] + t * (ERF_A[2] + t * (ERF_A[3] + t * ERF_A[4]))))
    y = 1.0 - poly * np.exp(-a * a)
    out: np.ndarray = np.copysign(y, x).astype(x.dtype, copy=False)
    return out


def activate(y: np.ndarray, activation: str) -> np.ndarray:
    """The activation applied elementwise, in y's dtype (a new array, or `y` itself for `none`)."""
    out: np.ndarray
    if activation == "none":
        out = y
    elif activation == "relu":
        out = np.maximum(y, 0)
    elif activation == "gelu":
        out = 0.5 * y * (1.0 + erf(y * y.dtype.type(0.7071067811865476)))
    elif activation == "gelu_tanh":
        out = 0.5 * y * (1.0 + np.tanh(_SQRT_2_OVER_PI * (y + 0.044715 * y * y * y)))
    elif activation == "silu":
        with np.errstate(over="ignore"):  # exp(-y) overflows to inf for very negative y: silu is then -0
            out = y / (1.0 + np.exp(-y))
    else:
        raise ValueError(f"unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
    return out.astype(y.dtype, copy=False)


def apply_epilogue(y: np.ndarray, bias: np.ndarray | None, epilogue: Epilogue) -> np.ndarray:
    """Y + bias, then the activation (in place on `y` where it can be)."""
    if epilogue.bias:
        if bias is None:
            raise ValueError("this layer's epilogue adds a bias: pass bias=")
        y += bias
    return activate(y, epilogue.activation)


def dense_reference(
    x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None, epilogue: Epilogue = NO_EPILOGUE
) -> np.ndarray:
    """act(X·Wᵀ + bias) with numpy: what a host runs without uKernels (the vendor side of every timing)."""
    return apply_epilogue(x @ w.T, bias, epilogue)


def check_bias(epilogue: Epilogue, bias: np.ndarray | None, N: int | None, dtype: np.dtype[Any] | None = None) -> None:
    """A clear error when `bias` does not fit the epilogue: required iff it adds one, shape [N]."""
    if epilogue.bias and bias is None:
        raise ValueError("this layer's epilogue adds a bias (its dispatch table says so): pass bias=")
    if not epilogue.bias and bias is not None:
        raise ValueError("this layer was tuned without a bias: its dispatch table has no bias to add; drop bias=")
    if bias is not None:
        if bias.ndim != 1 or (N is not None and bias.shape[0] != N):
            raise ValueError(f"bias must be [{N if N is not None else 'N'}], got {list(bias.shape)}")
        if dtype is not None and bias.dtype != dtype:
            raise ValueError(f"bias must be {dtype}, got {bias.dtype}")
