"""Which targets a platform takes, the queue that serves them and the TVM target they compile for."""

import pytest

from service.models import TargetSpec, Toolchain
from service.tuning.admission import check_target
from service.tuning.kinds import Problem
from service.tuning.platforms import queue_for, tvm_target


def _t(**kw: object) -> TargetSpec:
    base: dict[str, object] = {"kind": "llvm", "mcpu": "znver4", "num_cores": 2, "toolchain": {"tvm": "0.27.0.post1"}}
    return TargetSpec.model_validate({**base, **kw})


def test_platforms_check_their_targets() -> None:
    assert "mcpu" in str(check_target(TargetSpec(kind="llvm", num_cores=2)))
    assert "arch" in str(check_target(TargetSpec(kind="cuda")))
    assert check_target(TargetSpec(kind="tpu")) == Problem(
        ("kind",), "unknown platform 'tpu'; known: cuda, gemmini, llvm"
    )
    assert check_target(TargetSpec(kind="llvm", mcpu="host")) is None  # resolved against live workers


def test_queues_follow_the_hardware() -> None:
    assert queue_for(_t()) == "cpu.znver4"
    assert queue_for(TargetSpec(kind="cuda", arch="sm_80")) == "gpu.sm_80"
    assert queue_for(TargetSpec(kind="gemmini", arch="default")) == "firesim"
    assert _t().with_toolchain(Toolchain(tvm="x")).toolchain == Toolchain(tvm="x")
    assert tvm_target(_t()) == {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}


def test_hidden_isa_extensions_are_other_hardware() -> None:
    no_avx512 = _t(features=["-avx512f"])
    assert queue_for(no_avx512) == "cpu.znver4.no-avx512f"
    assert tvm_target(no_avx512)["mattr"] == ["-avx512f"]
    assert no_avx512.fingerprint != _t().fingerprint
    assert tvm_target(_t(features=["avx512bf16"]))["mattr"] == ["+avx512bf16"]


@pytest.mark.parametrize("op", ["batch_matmul", "conv2d"])
def test_the_cuda_vendor_covers_every_pipeline_op(op: str) -> None:
    """batch_matmul and conv2d have GPU vendor baselines (torch.matmul, F.conv2d): on this host the call stops at
    the missing GPU, not at 'the cuBLAS baseline covers dense' after a whole pipeline search."""
    from service.models import WorkloadSpec
    from service.tuning.platforms import platform_for

    workloads = {
        "batch_matmul": WorkloadSpec(op="batch_matmul", dims={"B": 12, "N": 128, "K": 64}, symbolic=["M"]),
        "conv2d": WorkloadSpec(
            op="conv2d",
            dims={"H": 14, "W": 14, "CI": 64, "CO": 64, "KH": 3, "KW": 3},
            symbolic=["N"],
            attrs={"stride": 1, "padding": 1},
        ),
    }
    shape = {"M": 128} if op == "batch_matmul" else {"N": 2}
    with pytest.raises(RuntimeError, match="torch"):
        platform_for("cuda").vendor(workloads[op], shape, kernel_only=True)
