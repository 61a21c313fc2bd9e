"""Every registered operator's TVM definition computes what its numpy reference computes."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from kernelfleet.tvm_kernel import Kernel, module_params
from service.models import WorkloadSpec
from service.tuning.compute import prim_func, random_inputs, reference, tolerance
from service.tuning.hardware import host_target
from service.tuning.platforms import tvm_target

EPI_DIMS = {"N": 24, "K": 40}
CASES = [
    (WorkloadSpec(op="dense", dims={"N": 24, "K": 40}, symbolic=["M"]), {"M": 7}),
    (WorkloadSpec(op="dense", dims={"N": 24, "K": 40}, symbolic=["M"], attrs={"bias": True}), {"M": 5}),
    *(
        (WorkloadSpec(op="dense", dims=EPI_DIMS, symbolic=["M"], attrs={"bias": b, "activation": a}), {"M": 3})
        for b, a in ((True, "gelu"), (False, "silu"), (True, "gelu_tanh"), (False, "relu"))
    ),
    (WorkloadSpec(op="batch_matmul", dims={"B": 3, "N": 16, "K": 64}, symbolic=["M"]), {"M": 13}),
    (
        WorkloadSpec(
            op="conv2d",
            dims={"N": 1, "CI": 8, "CO": 16, "KH": 3, "KW": 3},
            symbolic=["H", "W"],
            attrs={"stride": 2, "padding": 1},
        ),
        {"H": 9, "W": 7},
    ),
    (WorkloadSpec(op="conv2d", dims={"N": 2, "H": 6, "W": 6, "CI": 4, "CO": 8, "KH": 1, "KW": 1}), {}),
]


def test_a_dense_epilogue_is_one_stage_and_a_bias_alone_keeps_its_block_name() -> None:
    """Stored MetaSchedule traces of biased dense layers name the block Y_bias: it stays; with an activation
    bias and activation are one elementwise stage after the product."""

    def blocks(attrs: dict[str, bool | str]) -> list[str]:
        w = WorkloadSpec(op="dense", dims={"N": 24, "K": 40}, symbolic=["M"], attrs=attrs)
        return [p.name for p in prim_func(w, {"M": 5})["main"].params]

    assert blocks({}) == ["X", "W", "Y"]
    assert blocks({"bias": True}) == ["X", "W", "bias", "Y_bias"]
    assert blocks({"bias": True, "activation": "gelu"}) == ["X", "W", "bias", "Y_epilogue"]
    assert blocks({"activation": "relu"}) == ["X", "W", "Y_epilogue"]


@pytest.mark.parametrize(("workload", "shape"), CASES, ids=lambda c: getattr(c, "op", str(c)))
def test_unscheduled_kernel_matches_numpy(workload: WorkloadSpec, shape: dict[str, int]) -> None:
    mod = prim_func(workload, shape)
    target = tvm_target(host_target())
    kernel = Kernel(tvm.compile(mod, target=tvm.target.Target(target)), target, module_params(mod["main"]))
    inputs = random_inputs(workload, shape)
    expected = reference(workload)(*inputs)
    got = kernel(*inputs)
    assert got.shape == expected.shape
    assert float(np.abs(got - expected).max()) <= tolerance(workload, shape)


def test_bfloat16_workloads_get_inputs_a_reference_and_a_tolerance_of_their_own() -> None:
    """numpy has no bfloat16 BLAS: inputs are ml_dtypes' bfloat16, the reference sums them in fp32 (as the GPU
    uKernels do), and the check allows a result rounded to bfloat16, which the fp32 tolerance would not."""
    from service.tuning.platforms.base import check_result

    wl = WorkloadSpec(op="dense", dtype="bfloat16", dims={"N": 64, "K": 768}, symbolic=["M"])
    x, w = random_inputs(wl, {"M": 9})
    assert x.dtype.name == w.dtype.name == "bfloat16"
    expected = reference(wl)(x, w)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    assert expected.dtype == np.float32 and np.abs(expected - exact).max() < 1e-3
    rounded = expected.astype(x.dtype)  # what a kernel with a bfloat16 Y returns
    fp32 = wl.model_copy(update={"dtype": "float32"})
    assert check_result(rounded, expected, tolerance(fp32, {"M": 9})) is not None
    assert check_result(rounded, expected, tolerance(wl, {"M": 9})) is None
    assert check_result(rounded * 1.05, expected, tolerance(wl, {"M": 9})) is not None  # a wrong result still fails
