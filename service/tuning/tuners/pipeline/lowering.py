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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from service.tuning.builder.cuda import cuda_target, pass_config
from service.tuning.cuda_toolchain import configure_cuda_compile
from service.tuning.tuners.pipeline.rules import IllegalSchedule, check_tir, gemm_plan, require_legal
from service.tuning.tuners.pipeline.schedule import (
    GemmTile,
    _annotate_pipeline,
    _cooperative_fetch,
    cuda_source,
    schedule_gemm,
)
from service.tuning.tuners.pipeline.space import GemmShape, PipelineConfig, gemm_of

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


@dataclass(frozen=True)
class Conv2dGeometry:
    """An NHWC conv2d as the implicit GEMM C[N·OH·OW, CO] = im2col(I)[·, KH·KW·CI] · F'[CO, KH·KW·CI]ᵀ.
    C is the NHWC output O[N, OH, OW, CO] with its first three axes flattened (the same memory)."""

    n: int | None  # None: symbolic batch
    h: int
    w: int
    ci: int
    co: int
    kh: int
    kw: int
    stride: int = 1
    padding: int = 0

    @property
    def oh(self) -> int:
        return (self.h + 2 * self.padding - self.kh) // self.stride + 1

    @property
    def ow(self) -> int:
        return (self.w + 2 * self.padding - self.kw) // self.stride + 1

    @classmethod
    def of(
        cls, dims: Mapping[str, int], attrs: Mapping[str, int | bool | str], symbolic_n: bool = False
    ) -> Conv2dGeometry:
        return cls(
            None if symbolic_n else dims["N"], dims["H"], dims["W"], dims["CI"], dims["CO"], dims["KH"], dims["KW"],
            int(attrs.get("stride", 1)), int(attrs.get("padding", 0)),
        )  # fmt: skip


def schedule(
    config: PipelineConfig, gemm: GemmShape, symbolic_m: bool = False, conv: Conv2dGeometry | None = None
) -> Any:
    """The scheduled module for `config` (rules checked first; IllegalSchedule names the broken rule).

    Dense (batch 1) is `schedule.schedule_gemm`; batch_matmul and conv2d (`conv` given, its batch symbolic
    when `symbolic_m`) follow the same recipe on their own modules, the batch bound to blockIdx.z."""
    require_legal(gemm_plan(config))
    tile = tile_of(config)
    m = None if symbolic_m else gemm.m
    if conv is not None:
        problem = check_conv(conv, gemm.dtype)
        if problem:
            raise ValueError(problem)
        sch = _schedule_gemm_like(_conv2d_module(conv, gemm.dtype), tile, gemm, batched=False)
    elif gemm.batch == 1:
        sch = schedule_gemm(tile, gemm.n, gemm.k, m, gemm.dtype)
    else:
        sch = _schedule_gemm_like(batch_matmul_module(gemm.batch, gemm.n, gemm.k, m, gemm.dtype), tile, gemm, True)
    if config.reg_stages > 1:
        _register_pipeline(sch, config, "C_update" if conv is not None or gemm.batch > 1 else "Y_update")
    violations = check_tir(sch.mod["main"])  # the plan was legal; the schedule must be too
    if violations:
        raise IllegalSchedule(violations)
    return sch


def _accumulate(a: Any, b: Any, axis: Any) -> Any:
    from tvm import te

    return te.sum(a.astype("float32") * b.astype("float32"), axis=axis)


def batch_matmul_module(batch: int, n: int, k: int, m: int | None = None, dtype: str = "float32") -> Any:
    """C[b,M,N] = A[b,M,K]·Bt[b,N,K]ᵀ (the registry's batch_matmul), fp32 accumulate; M symbolic when None."""
    import tvm
    from tvm import te

    rows: Any = te.var("M") if m is None else m
    a = te.placeholder((batch, rows, k), name="A", dtype=dtype)
    bt = te.placeholder((batch, n, k), name="Bt", dtype=dtype)
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((batch, rows, n), lambda b, i, j: _accumulate(a[b, i, r], bt[b, j, r], r), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, bt, c])})


def _conv2d_module(g: Conv2dGeometry, dtype: str) -> Any:
    """I[N,H,W,CI], W = pack_filter(F) → C[N·OH·OW, CO]; the padding and im2col are computations the schedule
    inlines into the shared-memory copy of I after pipelining (ALCOP's ordering rule). A 16-byte copy of
    im2col(I) stays inside one filter tap only when CI is a multiple of the copy's vector (`check_conv`)."""
    import tvm
    from tvm import te, tirx

    batch: Any = te.var("N") if g.n is None else g.n
    p, s = g.padding, g.stride
    inp = te.placeholder((batch, g.h, g.w, g.ci), name="I", dtype=dtype)
    packed = te.placeholder((g.co, g.kh * g.kw * g.ci), name="W", dtype=dtype)  # `pack_filter(F)`
    padded = te.compute(
        (batch, g.h + 2 * p, g.w + 2 * p, g.ci),
        lambda n, y, x, c: tirx.if_then_else(
            tirx.all(y >= p, y < g.h + p, x >= p, x < g.w + p), inp[n, y - p, x - p, c], tirx.const(0, dtype)
        ),
        name="I_pad",
    )
    window, hw = g.kw * g.ci, g.oh * g.ow
    a = te.compute(
        (batch * hw, g.kh * window),
        lambda m, r: padded[m // hw, (m % hw) // g.ow * s + r // window, m % g.ow * s + r % window // g.ci, r % g.ci],
        name="A",
    )
    r = te.reduce_axis((0, g.kh * window), name="k")
    c = te.compute((batch * hw, g.co), lambda i, j: _accumulate(a[i, r], packed[j, r], r), name="C")
    return tvm.IRModule({"main": te.create_prim_func([inp, packed, c])})


def pack_filter(flt: Any) -> Any:
    """F[KH,KW,CI,CO] → W[CO, KH·KW·CI], once per weight: the implicit GEMM's B operand, contiguous along the
    reduction. (Reading F in place would gather along K with stride CO, which TVM 0.27 lowers to 16-byte
    cp.async copies of the wrong elements.)"""
    kh, kw, ci, co = flt.shape
    return flt.transpose(3, 0, 1, 2).reshape(co, kh * kw * ci).copy()


def check_conv(g: Conv2dGeometry, dtype: str) -> str | None:
    """Why the implicit GEMM cannot serve this conv2d, or None."""
    lanes = 16 // (4 if dtype == "float32" else 2)
    if g.ci % lanes:
        return f"CI={g.ci} must be a multiple of {lanes} (one 16-byte copy must not cross a filter tap)"
    return None


def _schedule_gemm_like(module: Any, tile: GemmTile, gemm: GemmShape, batched: bool) -> Any:
    """`schedule_gemm`'s recipe on block "C" of `module`: pad M, tile, stage both operands through shared memory
    with cooperative (cp.async) fetches at the k loop, pipeline it, then inline every computed producer (M's
    padding, im2col, the filter transpose) into the copies. A batch axis goes to blockIdx.z."""
    from tvm import s_tir

    problem = tile.problem(gemm.n, gemm.k)
    if problem:
        raise ValueError(problem)
    sch = s_tir.Schedule(module)
    blk = sch.get_sblock("C")
    sch.pad_einsum(blk, [1, tile.bm, 1, 1] if batched else [tile.bm, 1, 1])
    consumers = sch.get_consumers(blk)
    ccopy = consumers[0] if consumers else sch.cache_write(blk, 0, "global")
    *batch, i, j, kk = sch.get_loops(blk)
    bi, ty, ii = sch.split(i, [None, tile.threads_y, tile.tm])
    bj, tx, jj = sch.split(j, [None, tile.threads_x, tile.tn])
    ko, ki = sch.split(kk, [None, tile.bk])
    sch.reorder(*batch, bj, bi, ty, tx, ko, ki, ii, jj)
    if batch:
        sch.bind(batch[0], "blockIdx.z")
    sch.bind(bj, "blockIdx.x")
    sch.bind(bi, "blockIdx.y")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.set_scope(blk, 0, "local")
    sch.reverse_compute_at(ccopy, tx)
    computed = _computed_producers(sch, blk)
    for idx in (0, 1):
        shared = sch.cache_read(blk, idx, "shared")
        sch.compute_at(shared, ko)
        _cooperative_fetch(sch, shared, 5 + len(batch), tile, gemm.dtype)  # under [b,] bj, bi, ty, tx, ko
    for producer in computed:  # after pipelining: the copies stay copies of global memory (with predicates)
        sch.compute_inline(producer)
    sch.decompose_reduction(blk, ko)
    _annotate_pipeline(sch, ko, tile)
    return sch


def _computed_producers(sch: Any, block: Any) -> list[Any]:
    """Every computed block feeding `block`, nearest first (inlining order: each into its consumer)."""
    out: list[Any] = []
    frontier = list(sch.get_producers(block))
    while frontier:
        producer = frontier.pop(0)
        out.append(producer)
        frontier += list(sch.get_producers(producer))
    return out


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


def build(
    config: PipelineConfig, gemm: GemmShape, arch: str, symbolic_m: bool = False, conv: Conv2dGeometry | None = None
) -> Any:
    """Compile under the pipeline PassContext (cp.async on sm_80+); on a host without a GPU the device part is
    CUDA source only."""
    import tvm

    sch = schedule(config, gemm, symbolic_m, conv)
    target = tvm.target.Target(cuda_target(arch))
    configure_cuda_compile()  # nvcc through TVM's callback, as every GPU build
    with target, tvm.transform.PassContext(opt_level=3, config=pass_config(arch)):
        return tvm.tirx.build(sch.mod, target=target)


def source(
    config: PipelineConfig, gemm: GemmShape, arch: str, symbolic_m: bool = False, conv: Conv2dGeometry | None = None
) -> str:
    return cuda_source(build(config, gemm, arch, symbolic_m, conv))


def time_kernel(
    config: PipelineConfig,
    gemm: GemmShape,
    arch: str,
    conv: Conv2dGeometry | None,
    inputs: list[Any],
    expected: Any,
    tolerance: float | None,
) -> tuple[float, str | None]:
    """Build one configuration and time it on this host's GPU (TVM's time_evaluator, kernel only, at least
    50 ms per repeat, median of repeats); with `tolerance`, check the result first. Runs in the measuring
    child process (service.tuning.isolation), so it takes and returns plain picklable values."""
    import numpy as np
    import tvm

    module = build(config, gemm, arch, conv=conv)
    dev = tvm.cuda(0)
    args = [tvm.runtime.tensor(a, dev) for a in inputs]
    out = tvm.runtime.tensor(np.zeros(expected.shape, dtype="float32"), dev)
    module["main"](*args, out)
    error = None
    if tolerance is not None:
        err = float(np.abs(out.numpy() - expected).max())
        error = None if err <= tolerance else f"max abs error {err:.3g}"
    timer = module.time_evaluator("main", dev, number=20, repeat=5, min_repeat_ms=50)
    return float(np.median(timer(*args, out).results)), error


class Measurer:
    """Builds and times configurations on this host's GPU, each in the measuring child process: a candidate
    that hangs is killed after `timeout_s`, one that faults takes only the child with it (isolation.py), and
    either is recorded as a failed measurement while the search goes on."""

    def __init__(
        self,
        workload: WorkloadSpec,
        shape: Mapping[str, int],
        target: TargetSpec,
        timeout_s: float,
        measure: Callable[..., tuple[float, str | None]] = time_kernel,
    ) -> None:
        from service.tuning.isolation import IsolatedRunner

        self.workload, self.shape, self.target = workload, dict(shape), target
        self.gemm = gemm_for(workload, shape)
        self.conv = Conv2dGeometry.of(workload.bind(shape), workload.attrs) if workload.op == "conv2d" else None
        self.timeout_s = timeout_s
        self.errors: dict[PipelineConfig, str] = {}
        self._inputs: tuple[list[Any], Any] | None = None
        self._measure = measure
        self.runner = IsolatedRunner(timeout_s)

    def __call__(self, configs: Sequence[PipelineConfig]) -> list[float]:
        out = []
        for config in configs:
            try:
                out.append(self._time(config)[0])
            except Exception as exc:  # a candidate that fails to build, run or answer is a measured failure
                self.errors[config] = f"{type(exc).__name__}: {exc}"[:500]
                out.append(math.inf)
        return out

    def _data(self) -> tuple[list[Any], Any]:
        """The kernel's arguments (a conv2d filter packed once) and the expected output, in the kernel's shape."""
        if self._inputs is None:
            from service.tuning.compute import random_inputs, reference

            inputs = random_inputs(self.workload, self.shape, seed=1)
            expected = reference(self.workload)(*inputs)
            if self.conv is not None:
                inputs = [inputs[0], pack_filter(inputs[1])]
                expected = expected.reshape(-1, self.conv.co)  # NHWC output = C[N·OH·OW, CO]
            self._inputs = (inputs, expected)
        return self._inputs

    def _time(self, config: PipelineConfig, check: bool = False) -> tuple[float, str | None]:
        from service.tuning.compute import tolerance

        inputs, expected = self._data()
        bound = tolerance(self.workload, self.shape) if check else None
        seconds, error = self.runner.run(
            self._measure, config, self.gemm, self.target.arch or "", self.conv, inputs, expected, bound
        )
        return float(seconds), error

    def verify(self, config: PipelineConfig) -> tuple[float, str | None]:
        """The best kernel rebuilt, checked against the reference and timed again."""
        try:
            return self._time(config, check=True)
        except Exception as exc:
            return math.inf, f"{type(exc).__name__}: {exc}"[:500]

    def close(self) -> None:
        self.runner.close()
