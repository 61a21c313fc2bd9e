"""What admission (service/tuning/admission.py) accepts by dtype: each kind names the dtypes it tunes, and the
ukernel kind takes half precision only where its GPU tuner has kernels for it (tensor cores, sm_80+)."""

from __future__ import annotations

import pytest

from service.models import Budget, TargetSpec, WorkloadSpec
from service.models.distribution import Explicit
from service.tuning.admission import check_job

CPU = TargetSpec(kind="llvm", mcpu="znver4", num_cores=2)
A100 = TargetSpec(kind="cuda", arch="sm_80")
H100 = TargetSpec(kind="cuda", arch="sm_90a")
T4 = TargetSpec(kind="cuda", arch="sm_75")
DIST = Explicit.model_validate({"kind": "explicit", "points": [{"shape": {"M": 1}}, {"shape": {"M": 64}}]})


def _dense(dtype: str) -> WorkloadSpec:
    return WorkloadSpec(op="dense", dtype=dtype, dims={"N": 256, "K": 256}, symbolic=["M"])


def _check(kind: str, dtype: str, target: TargetSpec) -> tuple[tuple[str | int, ...], str] | None:
    problem = check_job(kind, _dense(dtype), DIST, target, Budget())
    return None if problem is None else (problem.loc, problem.message)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("target", [A100, H100], ids=["sm_80", "sm_90a"])
def test_half_precision_ukernel_jobs_are_accepted_on_tensor_core_gpus(dtype: str, target: TargetSpec) -> None:
    assert _check("ukernel", dtype, target) is None


@pytest.mark.parametrize(
    ("dtype", "target", "says"),
    [
        ("float16", CPU, "ukernel jobs on llvm targets tune float32, not float16"),
        ("bfloat16", CPU, "ukernel jobs on llvm targets tune float32, not bfloat16"),
        ("bfloat16", T4, "sm_80 or newer, not sm_75"),
        ("float16", T4, "sm_80 or newer, not sm_75"),
    ],
)
def test_half_precision_ukernel_jobs_elsewhere_are_refused_naming_the_dtype(
    dtype: str, target: TargetSpec, says: str
) -> None:
    found = _check("ukernel", dtype, target)
    assert found is not None and found[0] == ("workload", "dtype") and says in found[1], found


def test_kinds_that_do_not_take_bfloat16_refuse_it_naming_the_dtype() -> None:
    found = _check("sketch", "bfloat16", CPU)
    assert found == (("workload", "dtype"), "sketch jobs tune float16, float32 workloads, not bfloat16")
    found = _check("pipeline", "bfloat16", H100)
    assert found is not None and found[0] == ("workload", "dtype")
    assert _check("sketch", "float16", CPU) is None  # what every kind took before is still taken


def test_ukernel_families_without_half_precision_kernels_refuse_it() -> None:
    bmm = WorkloadSpec(op="batch_matmul", dtype="bfloat16", dims={"B": 12, "N": 64, "K": 64}, symbolic=["M"])
    problem = check_job("ukernel", bmm, DIST, CPU, Budget())
    assert problem is not None and problem.loc == ("workload", "dtype")
