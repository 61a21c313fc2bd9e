import pytest
from pydantic import ValidationError

from service.models import TargetSpec, Toolchain


def _t(**kw: object) -> TargetSpec:
    base: dict[str, object] = {"kind": "llvm", "mcpu": "znver4", "num_cores": 2, "toolchain": {"tvm": "0.27.0.post1"}}
    return TargetSpec.model_validate({**base, **kw})


def test_fingerprint_covers_hardware_and_toolchain() -> None:
    base = _t()
    assert base.fingerprint == _t().fingerprint
    assert base.fingerprint != _t(mcpu="skylake-avx512").fingerprint
    assert base.fingerprint != _t(num_cores=4).fingerprint
    assert base.fingerprint != _t(toolchain={"tvm": "0.28.0"}).fingerprint
    assert base.fingerprint != _t(toolchain={"tvm": "0.27.0.post1", "tuner_abi": "2"}).fingerprint
    assert _t(features=["avx512f", "avx2"]).fingerprint == _t(features=["avx2", "avx512f"]).fingerprint


def test_llvm_needs_mcpu_and_fingerprint_needs_toolchain() -> None:
    with pytest.raises(ValidationError, match="mcpu"):
        TargetSpec(kind="llvm", num_cores=2)
    with pytest.raises(ValueError, match="toolchain"):
        _ = TargetSpec(kind="llvm", mcpu="znver4").fingerprint
    with pytest.raises(ValidationError, match="arch"):
        TargetSpec(kind="cuda")


def test_queues_follow_the_hardware() -> None:
    assert _t().queue == "cpu.znver4"
    assert TargetSpec(kind="cuda", arch="sm_80").queue == "gpu.sm_80"
    assert TargetSpec(kind="gemmini", arch="default").queue == "firesim"
    assert _t().with_toolchain(Toolchain(tvm="x")).toolchain == Toolchain(tvm="x")
    assert _t().tvm_target() == {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}


def test_hidden_isa_extensions_are_other_hardware() -> None:
    no_avx512 = _t(features=["-avx512f"])
    assert no_avx512.queue == "cpu.znver4.no-avx512f"
    assert no_avx512.tvm_target()["mattr"] == ["-avx512f"]
    assert no_avx512.fingerprint != _t().fingerprint
    assert _t(features=["avx512bf16"]).tvm_target()["mattr"] == ["+avx512bf16"]
