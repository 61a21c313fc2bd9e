"""TVM compute definitions and numpy references for every registered operator.

The one place that turns a workload from the registry into a TVM PrimFunc. Plain `te.compute`
(no layout-free annotations), so a tuned kernel keeps the operator's natural signature and its
measured latency includes everything a caller pays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import ml_dtypes  # noqa: F401  (registers numpy's "bfloat16", which workloads may name)
import numpy as np
import tvm
from tvm import te

from kernelfleet.epilogue import Epilogue, dense_reference
from service.models import WorkloadSpec
from service.tuning.epilogue import te_epilogue

Sizes = Mapping[str, int]


def _dense(w: WorkloadSpec, s: Sizes) -> list[te.Tensor]:
    x = te.placeholder((s["M"], s["K"]), name="X", dtype=w.dtype)
    wt = te.placeholder((s["N"], s["K"]), name="W", dtype=w.dtype)
    k = te.reduce_axis((0, s["K"]), name="k")
    y = te.compute((s["M"], s["N"]), lambda i, j: te.sum(x[i, k] * wt[j, k], axis=k), name="Y")
    epilogue = Epilogue.of_attrs(w.attrs)
    # a bias alone keeps its block name from before activations (stored MetaSchedule traces name it)
    name = "Y_bias" if epilogue.activation == "none" else "Y_epilogue"
    out, b = te_epilogue(y, s["N"], epilogue, w.dtype, name)
    return [x, wt, out] if b is None else [x, wt, b, out]


def _batch_matmul(w: WorkloadSpec, s: Sizes) -> list[te.Tensor]:
    a = te.placeholder((s["B"], s["M"], s["K"]), name="A", dtype=w.dtype)
    bt = te.placeholder((s["B"], s["N"], s["K"]), name="Bt", dtype=w.dtype)
    k = te.reduce_axis((0, s["K"]), name="k")
    c = te.compute((s["B"], s["M"], s["N"]), lambda b, i, j: te.sum(a[b, i, k] * bt[b, j, k], axis=k), name="C")
    return [a, bt, c]


def _conv2d(w: WorkloadSpec, s: Sizes) -> list[te.Tensor]:
    stride, pad = int(w.attrs["stride"]), int(w.attrs["padding"])
    derived = w.operator.derived(s, w.attrs)
    inp = te.placeholder((s["N"], s["H"], s["W"], s["CI"]), name="I", dtype=w.dtype)
    flt = te.placeholder((s["KH"], s["KW"], s["CI"], s["CO"]), name="F", dtype=w.dtype)
    padded = te.compute(
        (s["N"], s["H"] + 2 * pad, s["W"] + 2 * pad, s["CI"]),
        lambda n, h, x, c: tvm.tirx.if_then_else(
            tvm.tirx.all(h >= pad, h < s["H"] + pad, x >= pad, x < s["W"] + pad),
            inp[n, h - pad, x - pad, c],
            tvm.tirx.const(0, w.dtype),
        ),
        name="I_pad",
    )
    rh = te.reduce_axis((0, s["KH"]), name="rh")
    rw = te.reduce_axis((0, s["KW"]), name="rw")
    rc = te.reduce_axis((0, s["CI"]), name="rc")
    out = te.compute(
        (s["N"], derived["OH"], derived["OW"], s["CO"]),
        lambda n, h, x, co: te.sum(
            padded[n, h * stride + rh, x * stride + rw, rc] * flt[rh, rw, rc, co], axis=[rh, rw, rc]
        ),
        name="O",
    )
    return [inp, flt, out]


_TVM_BUILDERS: dict[str, Callable[[WorkloadSpec, Sizes], list[te.Tensor]]] = {
    "dense": _dense,
    "batch_matmul": _batch_matmul,
    "conv2d": _conv2d,
}


def prim_func(workload: WorkloadSpec, shape: Mapping[str, int]) -> tvm.IRModule:
    """The workload at one concrete shape (values of its symbolic dims) as an IRModule with `main`."""
    sizes = workload.bind(shape)
    return tvm.IRModule({"main": te.create_prim_func(_TVM_BUILDERS[workload.op](workload, sizes))})


def random_inputs(workload: WorkloadSpec, shape: Mapping[str, int], seed: int = 0) -> list[np.ndarray]:
    sizes = workload.bind(shape)
    rng = np.random.default_rng(seed)
    op = workload.operator
    return [
        rng.standard_normal(op.tensor_shape(t, sizes, workload.attrs)).astype(workload.dtype)
        for t in op.input_tensors(workload.attrs)
    ]


def _conv2d_reference(w: WorkloadSpec, inp: np.ndarray, flt: np.ndarray) -> np.ndarray:
    stride, pad = int(w.attrs["stride"]), int(w.attrs["padding"])
    padded = np.pad(inp, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    kh, kw = flt.shape[:2]
    windows = np.lib.stride_tricks.sliding_window_view(padded, (kh, kw), axis=(1, 2))[:, ::stride, ::stride]
    out: np.ndarray = np.einsum("nhwcij,ijco->nhwo", windows, flt, optimize=True).astype(inp.dtype)
    return out


def reference(workload: WorkloadSpec) -> Callable[..., np.ndarray]:
    """The vendor-library (numpy/BLAS) implementation: the correctness oracle and the baseline."""
    if workload.op == "dense":
        epilogue = Epilogue.of_attrs(workload.attrs)
        if workload.dtype == "bfloat16":  # numpy has no bfloat16 BLAS: fp32 sums of the inputs, as the kernels do

            def in_fp32(x: np.ndarray, wt: np.ndarray, *bias: np.ndarray) -> np.ndarray:
                b = bias[0].astype(np.float32) if bias else None
                return dense_reference(x.astype(np.float32), wt.astype(np.float32), b, epilogue)

            return in_fp32
        if epilogue.bias:
            return lambda x, wt, b: dense_reference(x, wt, b, epilogue)
        return lambda x, wt: dense_reference(x, wt, None, epilogue)
    if workload.op == "batch_matmul":
        return lambda a, bt: np.matmul(a, bt.transpose(0, 2, 1))
    if workload.op == "conv2d":
        return lambda i, f: _conv2d_reference(workload, i, f)
    raise KeyError(workload.op)


# how much looser than fp32 a result in this dtype is checked: its output rounding (2^-11 for float16, 2^-8 for
# bfloat16, relative to |Y| ~ √K) on top of fp32 summation error
_TOLERANCE_SCALE = {"float32": 1, "float16": 50, "bfloat16": 400}


def tolerance(workload: WorkloadSpec, shape: Mapping[str, int]) -> float:
    """Absolute error allowed against numpy: fp32 sums of standard-normal products grow with √reduction."""
    sizes = workload.bind(shape)
    depth = sizes["KH"] * sizes["KW"] * sizes["CI"] if workload.op == "conv2d" else sizes["K"]
    return 1e-4 * float(np.sqrt(depth)) * _TOLERANCE_SCALE[workload.dtype] + 1e-4
