"""Chosen pipeline schedules through TVM's CUDA codegen and nvcc (no GPU needed), and on a GPU when there is one.

The source must show what ALCOP's transformation produces: shared buffers enlarged by the stage count,
register fragments enlarged by the register stage count, cp.async copies grouped by commit/wait, and a
prologue that issues the first stages' copies before the main loop.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from service.tuning.cuda_toolchain import nvcc_path
from service.tuning.tuners.pipeline.lowering import Conv2dGeometry, source, tile_of
from service.tuning.tuners.pipeline.model import GPUConstants, rank
from service.tuning.tuners.pipeline.rules import IllegalSchedule
from service.tuning.tuners.pipeline.schedule import compile_cuda, pipeline_structure
from service.tuning.tuners.pipeline.space import GemmShape, PipelineConfig, gemm_of
from service.tuning.tuners.pipeline.tuner import legal_space

RN50_FC = GemmShape(1, 64, 1024, 2048)  # ALCOP's MM_RN50_FC: output 1024×64, reduction 2048
BERT_FC = GemmShape(1, 128, 3072, 768)
BERT_QK = GemmShape(12, 128, 128, 64)  # batch_matmul: 12 heads, sequence 128, head dim 64
BERT_SV = GemmShape(12, 128, 64, 128)
NVCC = nvcc_path()  # the pinned wheel's (pip install -e .[dev]) or one on PATH
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed on this host")

MULTI_LEVEL_FUSED = PipelineConfig(32, 32, 16, 2, 4, smem_stages=4, async_copy=True, reg_stages=2, fuse_inner=True)
MULTI_LEVEL = PipelineConfig(32, 32, 16, 2, 4, smem_stages=3, async_copy=True, reg_stages=3)
SHARED_ONLY = PipelineConfig(16, 64, 16, 1, 4, smem_stages=5, async_copy=True)


def _fragments(src: str) -> dict[str, int]:
    return {name: int(n) for name, n in re.findall(r"float (\w+)_shared_local_ptr\[(\d+)\]", src)}


def _has_prologue(src: str) -> bool:
    """cp.async call sites and a commit before the first iteration of the outer k loop."""
    body = src[src.index("__global__ void") :]
    head = body[: body.index("for (int k_0 ")]
    return re.search(r"^\s+ptx_cp_async\w*\(", head, re.MULTILINE) is not None and "commit_group" in head


@needs_nvcc
@pytest.mark.parametrize("symbolic_n", [False, True])
def test_conv2d_as_implicit_gemm_codegen_and_compile(symbolic_n: bool) -> None:
    """A ResNet 3×3 conv (14×14×256 → 256, padding 1): padding and im2col are inlined into the pipelined copy
    of the input (ALCOP's case 2), which stays a predicated cp.async; the filter is packed [CO, KH·KW·CI]."""
    dims = {"N": 1, "H": 14, "W": 14, "CI": 256, "CO": 256, "KH": 3, "KW": 3}
    gemm = gemm_of("conv2d", dims, {"padding": 1})
    conv = Conv2dGeometry.of(dims, {"padding": 1}, symbolic_n=symbolic_n)
    src = source(MULTI_LEVEL_FUSED, gemm, "sm_80", conv=conv)
    structure = pipeline_structure(src)
    assert structure.is_pipelined(tile_of(MULTI_LEVEL_FUSED)) and _has_prologue(src)
    assert re.search(r"ptx_cp_async\w*pred\w*\(A_pad_shared_ptr, [^;]*I_ptr", src)  # predicated: padding, rows
    assert len(compile_cuda(src, "sm_80", "cubin")) > 1000
    with pytest.raises(ValueError, match="CI=3"):
        source(MULTI_LEVEL_FUSED, gemm_of("conv2d", {**dims, "CI": 3}, {"padding": 1}), "sm_80",
               conv=Conv2dGeometry.of({**dims, "CI": 3}, {"padding": 1}))  # fmt: skip


def _best_by_model(shape: GemmShape, arch: str) -> PipelineConfig:
    space, _ = legal_space(shape)
    return rank(shape, space, GPUConstants.for_arch(arch))[0][0]


@needs_nvcc
@pytest.mark.parametrize(
    ("config", "shape", "arch"),
    [
        (MULTI_LEVEL_FUSED, RN50_FC, "sm_80"),
        (MULTI_LEVEL, BERT_FC, "sm_90"),
        (SHARED_ONLY, RN50_FC, "sm_80"),
        (None, RN50_FC, "sm_80"),  # what the analytical model ranks first
        (None, BERT_FC, "sm_90"),
        (None, BERT_QK, "sm_80"),  # batch_matmul: blockIdx.z over the batch
        (MULTI_LEVEL_FUSED, BERT_SV, "sm_90"),
    ],
)
def test_pipelined_schedules_codegen_and_compile(config: PipelineConfig | None, shape: GemmShape, arch: str) -> None:
    config = config or _best_by_model(shape, arch)
    assert config.async_copy and config.smem_stages > 1, config.key  # the model picks a pipelined schedule
    src = source(config, shape, arch, symbolic_m=True)
    structure = pipeline_structure(src)
    # stage-sized shared buffers: X and W tiles × smem stages
    assert config.smem_stages * config.bm * config.bk in structure.shared_buffers
    assert config.smem_stages * config.bn * config.bk in structure.shared_buffers
    assert structure.is_pipelined(tile_of(config))
    # cp.async with commit/wait groups; a k-stage pipeline waits on loads issued up to k−1 iterations earlier
    assert structure.cp_async > 0 and structure.commit_groups > 0
    assert config.smem_stages - 1 in structure.wait_groups
    assert _has_prologue(src)
    if config.reg_stages > 1:  # register fragments × register stages (multi-level); TVM may add versions
        lhs, rhs = ("X_pad", "W") if shape.batch == 1 else ("A_pad", "Bt")
        fragments = _fragments(src)
        assert set(fragments) == {lhs, rhs}
        assert fragments[lhs] % (config.reg_stages * config.tm) == 0
        assert fragments[rhs] % (config.reg_stages * config.tn) == 0
    else:
        assert _fragments(src) == {}
    assert len(compile_cuda(src, arch, "cubin")) > 1000


@needs_nvcc
def test_synchronous_stages_multi_buffer_without_cp_async() -> None:
    config = PipelineConfig(32, 32, 16, 2, 4, smem_stages=3)
    src = source(config, RN50_FC, "sm_80")
    structure = pipeline_structure(src)
    assert 3 * 32 * 16 in structure.shared_buffers and structure.cp_async == 0
    assert len(compile_cuda(src, "sm_80", "cubin")) > 1000


def test_fusion_changes_the_outer_pipeline() -> None:
    """Fused: the inner epilogue runs one outer stage later, so one more tile's copies are in flight."""
    fused = pipeline_structure(source(MULTI_LEVEL_FUSED, RN50_FC, "sm_80"))
    unfused = pipeline_structure(
        source(PipelineConfig(32, 32, 16, 2, 4, smem_stages=4, async_copy=True, reg_stages=2), RN50_FC, "sm_80")
    )
    assert fused.commit_groups > unfused.commit_groups


def test_illegal_schedules_are_rejected_before_build() -> None:
    with pytest.raises(IllegalSchedule, match="fusion"):
        source(PipelineConfig(32, 32, 16, 2, 4, smem_stages=4, async_copy=True, fuse_inner=True), RN50_FC, "sm_80")


def _cuda_device() -> bool:
    try:
        import tvm

        return bool(tvm.runtime.enabled("cuda") and tvm.cuda(0).exist)
    except Exception:
        return False


@pytest.mark.skipif(not _cuda_device(), reason="no CUDA GPU on this host: pipelined kernels are built, not run")
def test_pipelined_kernel_runs_correctly_on_the_gpu() -> None:
    import tvm

    from service.models import TargetSpec, WorkloadSpec
    from service.tuning.tuners.pipeline.lowering import Measurer

    arch = "sm_" + tvm.cuda(0).compute_version.replace(".", "")
    workload = WorkloadSpec(op="dense", dims={"N": 1024, "K": 2048}, symbolic=["M"])
    measurer = Measurer(workload, {"M": 64}, TargetSpec(kind="cuda", arch=arch), timeout_s=60)
    for config in (MULTI_LEVEL_FUSED, MULTI_LEVEL, SHARED_ONLY, MULTI_LEVEL_FUSED.unpipelined()):
        seconds, error = measurer.verify(config)
        assert error is None and 0 < seconds < 1, (config.key, error)


def _annotated(config: PipelineConfig, **annotations: list[int]) -> Any:
    """A legal schedule of RN50_FC whose outer k loop's pipeline annotations are replaced."""
    from service.tuning.tuners.pipeline.lowering import schedule

    sch = schedule(config, RN50_FC)
    ko = sch.get_loops(sch.get_sblock("Y_update"))[-4]
    for key, value in annotations.items():
        sch.unannotate(ko, key)
        sch.annotate(ko, key, value)
    return sch


def test_scheduled_tir_is_checked_against_the_rules() -> None:
    from service.tuning.tuners.pipeline.rules import check_tir
    from service.tuning.tuners.pipeline.schedule import schedule_gemm

    def rules(sch: Any) -> set[str]:
        return {v.rule for v in check_tir(sch.mod["main"])}

    assert rules(_annotated(MULTI_LEVEL_FUSED)) == set()
    # the compute (stage 3, writing the register accumulator) declared asynchronous: not a copy
    assert rules(_annotated(MULTI_LEVEL_FUSED, software_pipeline_async_stages=[3])) == {"async-copy"}
    # X and W shared copies in different stages need barriers in two places
    assert rules(_annotated(MULTI_LEVEL_FUSED, software_pipeline_stage=[0, 1, 3, 3, 4])) == {"sync-scope"}
    # a thread-bound loop annotated as a pipeline
    sch = schedule_gemm(tile_of(SHARED_ONLY), RN50_FC.n, RN50_FC.k, RN50_FC.m)
    tx = sch.get_loops(sch.get_sblock("Y_update"))[3]
    sch.annotate(tx, "software_pipeline_stage", [0])
    assert "sequential-loop" in rules(sch)
