"""From a pipeline configuration to a scheduled, built and timed CUDA kernel.

The shared-memory level is `schedule.schedule_gemm` (tiles, cp.async cooperative fetch, the k-loop's
software pipeline). This module adds the register level of ALCOP's multi-level pipeline: the block's
X/W fragments are cache-read from shared memory into registers at the inner k loop, which becomes a
pipeline of `reg_stages` stages. Nested pipelines are lowered inner first, so the outer loop then holds
five statements: the two shared copies, the inner prologue, the inner loop and the inner epilogue.
Unfused, all three inner parts run at the outer compute stage. Fused (ALCOP's inner-pipeline fusion),
the inner epilogue of tile i−1 moves one outer stage later and is ordered after the inner prologue of
tile i: the next tile's first register loads are issued before the previous tile's last FMAs, so the
inner pipeline never drains between outer iterations.

Every configuration is checked against ALCOP's rules (`rules.require_legal`) before it is scheduled.
Building and CUDA codegen need no GPU; `Measurer` runs kernels and needs one. Imports only TVM (lazily)
outside `Measurer`, so the GPU benchmark can use it on hosts without the service's dependencies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from service.workers.tuners.pipeline.rules import gemm_plan, require_legal
from service.workers.tuners.pipeline.schedule import (
    GemmTile,
    _annotate_pipeline,
    _cooperative_fetch,
    cuda_source,
    cuda_target,
    pass_config,
    schedule_gemm,
)
from service.workers.tuners.pipeline.space import GemmShape, PipelineConfig, gemm_of

if TYPE_CHECKING:  # the benchmark imports this module on GPU hosts without pydantic
    from service.models import TargetSpec, WorkloadSpec

STAGE_KEYS = ("software_pipeline_stage", "software_pipeline_order")


def gemm_for(workload: WorkloadSpec, shape: Mapping[str, int]) -> GemmShape:
    return gemm_of(workload.op, workload.bind(shape), workload.attrs, workload.dtype)


def tile_of(config: PipelineConfig) -> GemmTile:
    """The shared-memory level of `config` as `schedule.GemmTile`."""
    return GemmTile(
        bm=config.bm,
        bn=config.bn,
        bk=config.bk,
        tm=config.tm,
        tn=config.tn,
        stages=config.smem_stages,
        async_copy=config.async_copy,
    )


def schedule(config: PipelineConfig, gemm: GemmShape, symbolic_m: bool = False) -> Any:
    """The scheduled module for `config` (rules checked first; IllegalSchedule names the broken rule).

    Batch 1 is `schedule.schedule_gemm`'s dense GEMM; a batch_matmul adds blockIdx.z over the batch."""
    require_legal(gemm_plan(config))
    tile = tile_of(config)
    m = None if symbolic_m else gemm.m
    if gemm.batch == 1:
        sch, block = schedule_gemm(tile, gemm.n, gemm.k, m, gemm.dtype), "Y_update"
    else:
        sch, block = _schedule_batched(tile, gemm, m), "C_update"
    if config.reg_stages > 1:
        _register_pipeline(sch, config, block)
    return sch


def batch_matmul_module(batch: int, n: int, k: int, m: int | None = None, dtype: str = "float32") -> Any:
    """C[b,M,N] = A[b,M,K]·Bt[b,N,K]ᵀ (the registry's batch_matmul), fp32 accumulate; M symbolic when None."""
    import tvm
    from tvm import te

    rows: Any = te.var("M") if m is None else m
    a = te.placeholder((batch, rows, k), name="A", dtype=dtype)
    bt = te.placeholder((batch, n, k), name="Bt", dtype=dtype)
    r = te.reduce_axis((0, k), name="k")
    c = te.compute(
        (batch, rows, n),
        lambda b, i, j: te.sum(a[b, i, r].astype("float32") * bt[b, j, r].astype("float32"), axis=r),
        name="C",
    )
    return tvm.IRModule({"main": te.create_prim_func([a, bt, c])})


def _schedule_batched(tile: GemmTile, gemm: GemmShape, m: int | None) -> Any:
    """`schedule_gemm`'s recipe with the batch bound to blockIdx.z: pad M, tile, stage A/Bt tiles through
    shared memory with cooperative (cp.async) fetches at the k loop, pipeline it, inline the padding last."""
    from tvm import s_tir

    problem = tile.problem(gemm.n, gemm.k)
    if problem:
        raise ValueError(problem)
    sch = s_tir.Schedule(batch_matmul_module(gemm.batch, gemm.n, gemm.k, m, gemm.dtype))
    blk = sch.get_sblock("C")
    sch.pad_einsum(blk, [1, tile.bm, 1, 1])
    producers = sch.get_producers(blk)
    apad = producers[0] if producers else None
    consumers = sch.get_consumers(blk)
    ccopy = consumers[0] if consumers else sch.cache_write(blk, 0, "global")
    b, i, j, kk = sch.get_loops(blk)
    bi, ty, ii = sch.split(i, [None, tile.threads_y, tile.tm])
    bj, tx, jj = sch.split(j, [None, tile.threads_x, tile.tn])
    ko, ki = sch.split(kk, [None, tile.bk])
    sch.reorder(b, bj, bi, ty, tx, ko, ki, ii, jj)
    sch.bind(b, "blockIdx.z")
    sch.bind(bj, "blockIdx.x")
    sch.bind(bi, "blockIdx.y")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.set_scope(blk, 0, "local")
    sch.reverse_compute_at(ccopy, tx)
    for idx in (0, 1):
        shared = sch.cache_read(blk, idx, "shared")
        sch.compute_at(shared, ko)
        _cooperative_fetch(sch, shared, 6, tile, gemm.dtype)  # under b, bj, bi, ty, tx, ko
    if apad is not None:
        sch.compute_inline(apad)
    sch.decompose_reduction(blk, ko)
    _annotate_pipeline(sch, ko, tile)
    return sch


def _register_pipeline(sch: Any, config: PipelineConfig, block_name: str) -> None:
    block = sch.get_sblock(block_name)  # the reduction body after decompose_reduction
    ko, ki = sch.get_loops(block)[-4:-2]
    for operand in (1, 2):  # reads: [accumulator, X_shared, W_shared]
        fragment = sch.cache_read(block, operand, "local")
        sch.compute_at(fragment, ki)
    sch.annotate(ki, "software_pipeline_stage", [0, 0, config.reg_stages - 1])
    sch.annotate(ki, "software_pipeline_order", [0, 1, 2])
    if config.smem_stages > 1:
        s = config.smem_stages - 1
        for key in STAGE_KEYS:
            sch.unannotate(ko, key)
        # [copy X, copy W, inner prologue, inner loop, inner epilogue]
        if config.fuse_inner:
            sch.annotate(ko, "software_pipeline_stage", [0, 0, s, s, s + 1])
            sch.annotate(ko, "software_pipeline_order", [0, 1, 2, 4, 3])
        else:
            sch.annotate(ko, "software_pipeline_stage", [0, 0, s, s, s])
            sch.annotate(ko, "software_pipeline_order", [0, 1, 2, 3, 4])


def build(config: PipelineConfig, gemm: GemmShape, arch: str, symbolic_m: bool = False) -> Any:
    """Compile under the pipeline PassContext (cp.async on); on a host without a GPU the device part is
    CUDA source only."""
    from kernelfleet.tvm_kernel import import_tvm

    tvm = import_tvm()
    sch = schedule(config, gemm, symbolic_m)
    target = tvm.target.Target(cuda_target(arch))
    with target, tvm.transform.PassContext(opt_level=3, config=pass_config(arch)):
        return tvm.tirx.build(sch.mod, target=target)


def source(config: PipelineConfig, gemm: GemmShape, arch: str, symbolic_m: bool = False) -> str:
    return cuda_source(build(config, gemm, arch, symbolic_m))


class Measurer:
    """Builds and times configurations on this host's GPU (TVM's time_evaluator, median of repeats)."""

    def __init__(self, workload: WorkloadSpec, shape: Mapping[str, int], target: TargetSpec, timeout_s: float) -> None:
        self.workload, self.shape, self.target = workload, dict(shape), target
        self.gemm = gemm_for(workload, shape)
        self.timeout_s = timeout_s
        self.errors: dict[PipelineConfig, str] = {}

    def __call__(self, configs: Sequence[PipelineConfig]) -> list[float]:
        out = []
        for config in configs:
            try:
                out.append(self._time(config)[0])
            except Exception as exc:  # a candidate that fails to build or run is a measured failure
                self.errors[config] = f"{type(exc).__name__}: {exc}"[:500]
                out.append(math.inf)
        return out

    def _time(self, config: PipelineConfig, check: bool = False) -> tuple[float, str | None]:
        import numpy as np

        from kernelfleet.tvm_kernel import import_tvm
        from service.workers.tuners.compute import random_inputs, reference, tolerance

        tvm = import_tvm()
        module = build(config, self.gemm, self.target.arch or "")
        dev = tvm.cuda(0)
        inputs = random_inputs(self.workload, self.shape, seed=1)
        args = [tvm.runtime.tensor(a, dev) for a in inputs]
        out = tvm.runtime.tensor(np.zeros((self.gemm.m, self.gemm.n), dtype="float32"), dev)
        module["main"](*args, out)
        error = None
        if check:
            got = out.numpy()
            err = float(np.abs(got - reference(self.workload)(*inputs)).max())
            error = None if err <= tolerance(self.workload, self.shape) else f"max abs error {err:.3g}"
        timer = module.time_evaluator("main", dev, number=20, repeat=5)
        return float(np.median(timer(*args, out).results)), error

    def verify(self, config: PipelineConfig) -> tuple[float, str | None]:
        """The best kernel rebuilt, checked against the reference and timed again."""
        try:
            return self._time(config, check=True)
        except Exception as exc:
            return math.inf, f"{type(exc).__name__}: {exc}"[:500]
