"""The GPU ukernel tuner's pieces that need no GPU: building with the fatbin hash, artifacts, depths, routing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kernelfleet.cuda_ukernel import CudaDispatcher, CudaUKernel, CudaUKernelSpec, sha256_bytes
from kernelfleet.dispatch import DispatchTable, Interval, Shape
from service.models import TargetSpec
from service.tuning.builder.cuda import cuda_target
from service.tuning.cuda_toolchain import nvcc_path
from service.tuning.hardware_model import HardwareModel
from service.tuning.tuners.pipeline.schedule import GemmTile
from service.tuning.tuners.ukernel.gpu_build import build_cuda_ukernel, build_libraries
from service.tuning.tuners.ukernel.gpu_tuner import depth_candidates, gpu_hardware
from service.tuning.tuners.ukernel.tuner import QuietRangeSink, RangeTask
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


@pytest.mark.skipif(nvcc_path() is None, reason="no nvcc (pip install -e .[dev] brings the pinned wheel)")
def test_variants_build_in_parallel_processes_and_a_refused_one_is_reported(tmp_path: Path) -> None:
    """The GPU tuner builds every depth of every proposal before timing any (gpu_build): each variant exported
    once, content-addressed, its spec naming its depth; a variant TVM refuses comes back with its error."""
    good = [GemmTile(8, 32, 32, 1, 1, stages) for stages in (2, 3)]
    bad = GemmTile(8, 48, 32, 1, 1, 3)  # bn = 48 does not divide N = 64
    built = build_libraries([*good, good[0], bad], 64, 128, cuda_target("sm_90"), tmp_path, workers=2)
    assert set(built) == {t.label() for t in (*good, bad)}  # the duplicate built once
    for tile in good:
        lib = built[tile.label()]
        assert lib.error is None and lib.path is not None and lib.spec is not None
        assert lib.path.parent == tmp_path and sha256_bytes(lib.path.read_bytes()) == lib.sha256
        assert lib.spec.tile["stages"] == tile.stages and (lib.spec.N, lib.spec.K) == (64, 128)
    assert built[bad.label()].path is None and "48" in str(built[bad.label()].error)


def fake_time_library(path: str, spec: dict[str, Any], ms: list[int], l2_bytes: int) -> list[float]:
    """A stand-in timer for a host without a GPU (run by the measuring child, as the real one is): time grows with
    M and falls with the pipeline depth, so the depth search has a known answer."""
    assert Path(path).is_file()  # the child is handed a built library, not a tile to build
    stages = int(spec["tile"].get("stages", 1))
    return [1e-6 * (1 + m) / stages for m in ms]


class _Module:  # what load_cuda_ukernel would return on a GPU host: only `main` is looked up here
    def __getitem__(self, name: str) -> Any:
        return lambda *args: None


@pytest.mark.skipif(nvcc_path() is None, reason="no nvcc (pip install -e .[dev] brings the pinned wheel)")
def test_tune_dense_times_the_prebuilt_libraries_and_publishes_those_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tune_dense's wiring with the GPU steps stood in (timer, library loading, launch overhead): every depth of
    every proposal is built before any is timed, the deepest (fastest here) is chosen, and the artifacts are the
    very files that were built and timed."""
    from kernelfleet import cuda_ukernel
    from service.tuning.tuners.ukernel import gpu_tuner

    monkeypatch.setattr(gpu_tuner, "require_cuda", lambda: None)
    monkeypatch.setattr(cuda_ukernel, "require_cuda", lambda: None)  # the dispatchers the run builds
    monkeypatch.setattr(gpu_tuner, "time_library", fake_time_library)
    monkeypatch.setattr(gpu_tuner, "load_cuda_ukernel", lambda path, spec, sha256=None: CudaUKernel(_Module(), spec))
    monkeypatch.setattr(gpu_tuner.GPUUKernelTuner, "_piece_overhead", staticmethod(lambda kernels, N, K: 1e-6))
    job = gpu_tuner.DenseRange(
        256, 256, s_max=16, validate=(), target=cuda_target("sm_90"), hardware=HardwareModel.for_gpu("sm_90"),
        work_dir=tmp_path, max_ukernels=2, vendor_routes=False,
    )  # fmt: skip
    outcome = gpu_tuner.GPUUKernelTuner().tune_dense(job, QuietRangeSink())
    gemm = [c for c in outcome.candidates if c.get("gemm_tile", {}).get("kind") == "gemm" and "measured" in c]
    assert gemm, outcome.candidates
    for record in gemm:
        depths = record["depths_s"]
        assert all(isinstance(v, float) for v in depths.values()), depths
        assert record["gemm_tile"]["stages"] == max(int(name.rstrip("a")) for name in depths)
    assert outcome.artifacts and outcome.errors == 0
    for artifact in outcome.artifacts.values():
        assert (
            artifact.path.parent == tmp_path / "artifacts"
            and sha256_bytes(artifact.path.read_bytes()) == artifact.sha256
        )


@pytest.mark.skipif(nvcc_path() is None, reason="no nvcc (pip install -e .[dev] brings the pinned wheel)")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_half_precision_job_builds_and_publishes_ukernels_in_its_dtype(
    dtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workload's dtype reaches every step of a GPU ukernel run (GPU steps stood in as above): the screen
    proposes the GEMV family for small T and tensor-core tiles from T = 16 (never a float32 SIMT tile), every
    library is built in that dtype with Y in it too, and the dispatcher the job publishes takes that dtype."""
    from kernelfleet import cuda_ukernel
    from service.models import WorkloadSpec
    from service.tuning.tuners.pipeline.schedule import cuda_source
    from service.tuning.tuners.ukernel import gpu_tuner

    monkeypatch.setattr(gpu_tuner, "require_cuda", lambda: None)
    monkeypatch.setattr(cuda_ukernel, "require_cuda", lambda: None)
    monkeypatch.setattr(gpu_tuner, "time_library", fake_time_library)
    monkeypatch.setattr(gpu_tuner, "load_cuda_ukernel", lambda path, spec, sha256=None: CudaUKernel(_Module(), spec))
    monkeypatch.setattr(gpu_tuner.GPUUKernelTuner, "_piece_overhead", staticmethod(lambda kernels, N, K: 1e-6))
    built: dict[str, Any] = {}
    real_build = gpu_tuner.build_libraries

    def recording_build(*args: Any, **kwargs: Any) -> Any:
        built.update(real_build(*args, **kwargs))
        return built

    monkeypatch.setattr(gpu_tuner, "build_libraries", recording_build)
    task = RangeTask(
        workload=WorkloadSpec(op="dense", dtype=dtype, dims={"N": 256, "K": 256}, symbolic=["M"]),
        s_max=32, validate=[], target=TargetSpec(kind="cuda", arch="sm_90"), max_ukernels=3, work_dir=tmp_path,
        representative_m=32, vendor_routes=False,
    )  # fmt: skip
    outcome = gpu_tuner.GPUUKernelTuner().tune(task, QuietRangeSink())
    kinds = {c["gemm_tile"]["kind"] for c in outcome.candidates if "measured" in c}
    assert kinds == {"gemv", "tensorcore"}, outcome.candidates
    assert built and all(lib.spec is not None and lib.spec.dtype == dtype for lib in built.values())
    assert {a.spec.dtype for a in outcome.artifacts.values()} == {dtype}
    assert outcome.dispatcher is not None and outcome.dispatcher.dtype == dtype
    ctype = {"float16": "half", "bfloat16": "nv_bfloat16"}[dtype]
    spec = next(iter(outcome.artifacts.values())).spec
    from service.tuning.tuners.ukernel.gpu_kernels import build_module

    tile_kind = spec.tile["kind"]
    assert tile_kind in ("gemv", "tensorcore")
    source = cuda_source(build_module(_tile_of(spec.tile), 256, 256, cuda_target("sm_90"), dtype))
    assert f"{ctype}* __restrict__ Y_out_ptr" in source  # Y in the inputs' dtype, not fp32


def _tile_of(record: dict[str, Any]) -> Any:
    from service.tuning.tuners.pipeline.gemv import GemvTile
    from service.tuning.tuners.pipeline.tensorcore import TensorCoreTile

    fields = {k: v for k, v in record.items() if k != "kind"}
    return GemvTile(**fields) if record["kind"] == "gemv" else TensorCoreTile(**fields)


def test_a_dispatcher_takes_its_ukernels_dtype_and_refuses_a_mix(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from kernelfleet import cuda_ukernel

    def kernel(dtype: str) -> CudaUKernel:
        spec = CudaUKernelSpec(N=8, K=8, mt=4, tile={}, target={}, dtype=dtype)
        return CudaUKernel(_Module(), spec)

    assert CudaDispatcher(None, {}, N=8, K=8).dtype == "float32"
    assert CudaDispatcher(None, {"a": kernel("bfloat16")}, N=8, K=8).dtype == "bfloat16"
    with pytest.raises(ValueError, match="mix dtypes"):
        CudaDispatcher(None, {"a": kernel("float16"), "b": kernel("float32")}, N=8, K=8)
    monkeypatch.setattr(cuda_ukernel, "require_cuda", lambda: None)  # a table needs a GPU; none is launched here
    table = DispatchTable((Interval(1, 4, Shape((), "a")),), {"a": 4})
    half = CudaDispatcher(table, {"a": kernel("float16")}, N=8, K=8)
    with pytest.raises(ValueError, match=r"take float16 x and w, got torch\.float32"):
        half(torch.zeros(3, 8), torch.zeros(8, 8))
