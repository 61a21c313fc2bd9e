"""CUDA codegen + nvcc for every GPU uKernel and sampled MetaSchedule candidates, on a host without a GPU.

What runs here: TVM's CUDA source generation and nvcc (no GPU needed). What does not: running any of
it (tests/tuning/gpu/test_on_gpu.py, skipped without a GPU).
"""

from __future__ import annotations

import pytest

from service.tuning.builder.cuda import cuda_target
from service.tuning.cuda_toolchain import nvcc_path
from service.tuning.tuners.pipeline.schedule import (
    GemmTile,
    build_gemm,
    compile_cuda,
    cuda_source,
    pipeline_structure,
)
from service.tuning.tuners.ukernel.gpu_rules import gpu_ukernels
from tests.tuning.gpu.descriptions import card

needs_nvcc = pytest.mark.skipif(nvcc_path() is None, reason="no nvcc (pip install -e .[dev] brings the pinned wheel)")
LAYERS = {"qkv": (2304, 768), "ffn_down": (768, 3072)}


def _ukernels(arch: str, layer: str) -> list[GemmTile]:
    n, k = LAYERS[layer]
    return [c.tile for c in gpu_ukernels(card(arch).hardware_model(), n, k)]


@needs_nvcc
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_every_ukernel_compiles_with_a_pipeline(layer: str) -> None:
    n, k = LAYERS[layer]
    tiles = _ukernels("sm_90", layer)
    assert tiles
    for tile in tiles:
        src = cuda_source(build_gemm(tile, n, k, cuda_target("sm_90")))
        found = pipeline_structure(src)
        assert found.is_pipelined(tile), (tile.label(), found)
        # stage-sized shared buffers: stages copies of the X (bm×bk) and W (bn×bk) tiles
        assert tile.stages * tile.bm * tile.row_pitch in found.shared_buffers
        assert tile.stages * tile.bn * tile.row_pitch in found.shared_buffers
        # cp.async commit/wait groups: one commit per prologue stage and per steady-state step
        assert found.commit_groups >= tile.stages and found.wait_groups == tuple(range(tile.stages))
        if tile.split_k > 1:
            assert "blockIdx.z" in src and src.count("__global__") >= 2  # partial sums + the reduction kernel
        assert "M" in src.split("main_kernel(", 1)[1].split(")", 1)[0]  # one binary, M is a kernel argument
        assert len(compile_cuda(src, "sm_90")) > 1000


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_75"])
def test_ukernels_compile_for_other_arches(arch: str) -> None:
    n, k = LAYERS["qkv"]
    tiles = _ukernels(arch, "qkv")[:2]
    # cp.async is sm_80+: ptxas rejects it on a T4, so its uKernels double-buffer with plain loads
    assert all(t.async_copy == (arch != "sm_75") for t in tiles)
    if arch == "sm_75":
        with pytest.raises(ValueError, match="sm_80"):
            build_gemm(GemmTile(8, 32, 32, 1, 1, 3, async_copy=True), n, k, cuda_target(arch))
    for tile in tiles:
        src = cuda_source(build_gemm(tile, n, k, cuda_target(arch)))
        assert pipeline_structure(src).is_pipelined(tile)
        assert compile_cuda(src, arch)


@needs_nvcc
def test_pipeline_depth_shapes_the_source() -> None:
    n, k = LAYERS["qkv"]
    seen = {}
    for stages in (1, 2, 3, 4):
        tile = GemmTile(8, 32, 32, 2, 1, stages=stages)
        src = cuda_source(build_gemm(tile, n, k, cuda_target("sm_90")))
        found = pipeline_structure(src)
        assert found.is_pipelined(tile)
        assert sorted(found.shared_buffers) == sorted([stages * 8 * 32, stages * 32 * 32])
        seen[stages] = found
        compile_cuda(src, "sm_90")
    assert seen[1].cp_async == 0 and seen[1].wait_groups == ()
    assert seen[4].wait_groups == (0, 1, 2, 3) and seen[3].wait_groups == (0, 1, 2)
    sync = pipeline_structure(
        cuda_source(build_gemm(GemmTile(8, 32, 32, 2, 1, 3, async_copy=False), n, k, cuda_target("sm_90")))
    )
    assert sync.cp_async == 0 and sync.commit_groups == 0  # double buffering without async copies
    fixed_m = cuda_source(build_gemm(GemmTile(8, 32, 32, 2, 1, 3), n, k, cuda_target("sm_90"), m=61))
    assert pipeline_structure(fixed_m).cp_async > 0


@needs_nvcc
def test_sampled_sketch_candidates_compile_for_cuda() -> None:
    # imported here, not at the top: they need pydantic, which the GPU machine running this module lacks
    from service.models import TargetSpec, WorkloadSpec
    from service.tuning.builder.metaschedule import fast_build_cuda
    from service.tuning.compute import prim_func
    from service.tuning.platforms import tvm_target
    from service.tuning.tuners.sketch import sample_candidates

    workload = WorkloadSpec(op="dense", dims={"N": 2304, "K": 768}, symbolic=["M"])
    target = TargetSpec(kind="cuda", arch="sm_90", details=card("sm_90").details())
    target_dict = tvm_target(target)
    assert target_dict["max_threads_per_block"] == 1024 and target_dict["max_shared_memory_per_block"] == 49152
    import tvm

    schedules = sample_candidates(prim_func(workload, {"M": 16}), target_dict, count=4, seed=1)
    assert len(schedules) == 4
    compiled = 0
    for sch in schedules:
        module = fast_build_cuda(sch.mod, tvm.target.Target(target_dict), None)
        src = cuda_source(module)
        assert "__shared__" in src
        with tvm.target.Target(target_dict):
            compiled += bool(compile_cuda(src, "sm_90"))
    assert compiled == 4


def test_the_deliberately_bad_kernels_generate_cuda() -> None:
    """The faulting and hanging kernels of the GPU isolation test build here (source only), so a GPU session
    does not find a typo in them."""
    from tests.tuning.gpu import faulty_kernels

    fault = cuda_source(faulty_kernels.build(faulty_kernels.faulting(), "sm_90"))
    assert "fault_kernel(float* __restrict__ A_ptr, int n)" in fault
    assert "clock64()" in cuda_source(faulty_kernels.build(faulty_kernels.hanging(), "sm_90"))
