import pytest
from pydantic import ValidationError

from service.models import TargetSpec


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


def test_fingerprint_needs_toolchain_and_features_are_names() -> None:
    with pytest.raises(ValueError, match="toolchain"):
        _ = TargetSpec(kind="llvm", mcpu="znver4").fingerprint
    with pytest.raises(ValidationError, match="feature"):
        TargetSpec(kind="llvm", mcpu="znver4", features=["a b"])
