"""Dense epilogues in TVM TE: + bias[N] and an activation as one elementwise stage after the product.

The numpy side (the reference, and what the SDK runs on vendor routes) is kernelfleet.epilogue; this is the
same math as TE expressions, so compute.py's dense and the uKernel builder fuse it into the kernel that
writes Y. Free of pydantic and the service's models: GPU hosts import the uKernel builder without them.
"""

from __future__ import annotations

import math
from typing import Any

from kernelfleet.epilogue import ACTIVATIONS, NO_EPILOGUE, Epilogue
from kernelfleet.tvm_runtime import import_tvm

__all__ = ["ACTIVATIONS", "NO_EPILOGUE", "Epilogue", "te_activation", "te_epilogue"]


def te_activation(expr: Any, activation: str, dtype: str = "float32") -> Any:
    """`activation` of a scalar TIR expression (erf lowers to LLVM's polynomial on CPU targets)."""
    tvm = import_tvm()
    tirx = tvm.tirx

    def c(v: float) -> Any:
        return tirx.const(v, dtype)

    if activation == "none":
        return expr
    if activation == "relu":
        return tirx.max(expr, c(0.0))
    if activation == "gelu":
        return c(0.5) * expr * (c(1.0) + tirx.erf(expr * c(1.0 / math.sqrt(2.0))))
    if activation == "gelu_tanh":
        inner = c(math.sqrt(2.0 / math.pi)) * (expr + c(0.044715) * expr * expr * expr)
        return c(0.5) * expr * (c(1.0) + tirx.tanh(inner))
    if activation == "silu":
        return expr * tirx.sigmoid(expr)
    raise ValueError(f"unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}")


def te_epilogue(
    y: Any, n: int, epilogue: Epilogue, dtype: str = "float32", name: str = "Y_epilogue"
) -> tuple[Any, Any]:
    """(stage, bias placeholder or None): act(y[i, j] + bias[j]) over y's 2-D shape, as one compute stage.

    `n` is the bias length (the columns of y). With NO_EPILOGUE the stage is y itself and no placeholder.
    """
    if epilogue.trivial:
        return y, None
    import_tvm()
    from tvm import te

    bias = te.placeholder((n,), name="bias", dtype=dtype) if epilogue.bias else None

    def body(i: Any, j: Any) -> Any:
        v = y[i, j] + bias[j] if bias is not None else y[i, j]
        return te_activation(v, epilogue.activation, dtype)

    return te.compute(y.shape, body, name=name), bias
