"""The GPU ukernel tuner's pieces that need no GPU: building with the fatbin hash, artifacts, depths, routing."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelfleet.cuda_ukernel import CudaDispatcher, CudaUKernelSpec, sha256_bytes
from kernelfleet.dispatch import DispatchTable, Interval, Shape
from service.models import TargetSpec
from service.tuning.cuda_toolchain import nvcc_path
from service.tuning.tuners.pipeline.schedule import GemmTile, cuda_target
from service.tuning.tuners.ukernel.gpu_tuner import build_cuda_ukernel, depth_candidates, gpu_hardware
from service.tuning.tuners.ukernel.tuner import RangeTask
from tests.tuning.gpu.descriptions import card


def test_dispatcher_without_a_table_routes_every_s_to_the_vendor() -> None:
    d = CudaDispatcher(None, {}, N=8, K=8)
    assert d.routes_to_vendor(1) and d.routes_to_vendor(512) and d.program(3) == ()


def test_depths_fit_shared_memory_and_async_needs_sm80() -> None:
    h100 = card("sm_90").hardware_model()
    tile = GemmTile(32, 96, 32, 2, 2, 3)
    depths = depth_candidates(tile, 2304, 768, "sm_90", h100)
    assert [d.stages for d in depths] == [1, 2, 3] and all(d.smem_bytes() <= 49152 for d in depths)
    assert [d.async_copy for d in depths] == [False, True, True]  # 16 KiB per stage: 4 stages exceed 48 KiB
    t4 = card("sm_75").hardware_model()
    small = depth_candidates(GemmTile(8, 32, 32, 1, 1), 2304, 768, "sm_75", t4)
    assert [d.stages for d in small] == [1, 2, 3, 4] and not any(d.async_copy for d in small)


def test_hardware_from_the_job_target(tmp_path: Path) -> None:
    from service.models import WorkloadSpec

    details = card("sm_90").details() | {"sm_count": 114}
    task = RangeTask(
        workload=WorkloadSpec(op="dense", dims={"N": 768, "K": 768}, symbolic=["M"]),
        s_max=128,
        validate=[16],
        target=TargetSpec(kind="cuda", arch="sm_90", details=details),
        max_ukernels=4,
        work_dir=tmp_path,
    )
    hw = gpu_hardware(task)
    assert hw.sm_count == hw.cores == 114 and hw.smem_per_sm == 228 << 10


@pytest.mark.skipif(nvcc_path() is None, reason="no nvcc (pip install -e .[dev] brings the pinned wheel)")
def test_build_exports_content_addressed(tmp_path: Path) -> None:
    kernel = build_cuda_ukernel(GemmTile(8, 32, 32, 1, 1, 3), 768, 768, cuda_target("sm_90"))
    spec = kernel.spec
    # TVM has no CUDA runtime here, so the build holds CUDA source and no device code to hash (no separate
    # nvcc run stands in for it); test_compile_route.py builds the GPU way and checks the hash of what ships
    assert spec.mt == 8 and spec.fatbin_sha256 == "" and spec.tile["stages"] == 3
    assert CudaUKernelSpec.from_dict(spec.to_dict()) == spec
    path, digest = kernel.export(tmp_path)
    assert path.name == f"{digest}.so" and sha256_bytes(path.read_bytes()) == digest
    again, digest2 = kernel.export(tmp_path)
    assert (again, digest2) == (path, digest)  # the same bytes are stored once
    table = DispatchTable((Interval(1, 8, Shape((), "u")),), {"u": 8})
    assert table.lookup(5)[0].rows == 5
