"""Two uKernels compiled once for the whole folder: the padded path (mt > 1) and the unpadded one (mt = 1)."""

from __future__ import annotations

import pytest

from service.models import WorkloadSpec
from service.tuning.hardware import host_target
from service.tuning.platforms import tvm_target
from service.tuning.tuners.ukernel.kernel import UKernel, build_ukernel

N, K = 64, 32
TILES = {"mt6": (6, 32, 4), "mt1": (1, 16, 8)}


@pytest.fixture(scope="session")
def dense_workload() -> WorkloadSpec:
    return WorkloadSpec(op="dense", dims={"N": N, "K": K}, symbolic=["M"])


@pytest.fixture(scope="session")
def ukernels() -> dict[str, UKernel]:
    target = tvm_target(host_target())
    return {name: build_ukernel(N, K, mt, nt, kt, target) for name, (mt, nt, kt) in TILES.items()}
