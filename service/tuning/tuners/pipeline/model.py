"""ALCOP's analytical latency model of a pipelined GEMM kernel (thesis §3.5, Table 5.1).

    T_kernel     = T_threadblk × N_threadblk_batch      (+ one launch; a partial last batch: its own T_threadblk)
    T_threadblk  = T_init + T_main_loop + T_epilogue,   T_init = T_smem_load + T_reg_load
    T_main_loop  = Pipeline(T_smem_load, T_smem_use, N_smem_loop, N_smem_pipe_stage, N_threadblk_per_SM)
    T_smem_use   = Pipeline(T_reg_load,  T_compute,  N_reg_loop,  N_reg_pipe_stage,  N_warp_per_threadblk)
    Pipeline(t_load, t_use, n_loop, n_pipe, n_mplx) =
        t_use · n_loop                          if t_load ≤ (n_pipe · n_mplx − 1) · t_use   (compute-bound)
        (t_load + t_use) · n_loop / n_pipe      otherwise                                   (load-bound)
        (with t_use one stream's use phase, the compute-bound case takes n_mplx · t_use · n_loop:
        see `pipeline_latency`)
    T_compute    = FLOPs_one_reg_loop / (Throughput_SM × Util(warps, blocks per SM))
    T_smem_load  = max(T_LLC_load, T_DRAM_load)
    T_LLC_load   = LAT_LLC + Bytes_one_smem_loop × N_threadblk_per_batch / BW_LLC
    T_DRAM_load  = LAT_DRAM + Bytes_threadblk_batch_workset / BW_DRAM
    T_epilogue   = LAT_DRAM_write + Bytes_output_tile × N_threadblk_per_batch / BW_DRAM_write

A thread-block batch is the set of blocks resident at once (blocks per SM limited by shared memory,
registers, threads and the hardware's block slots). DRAM traffic is the batch's working set, not a sum
over blocks, because the blocks of a batch share the L2.

Choices the thesis leaves open (each marked [Inferred] in thesis.md §3.5), made here:
- Without `cp.async` a thread waits for its own global load before storing it to shared memory, so
  extra shared stages take no load off the critical path: N_smem_pipe = 1 (ALCOP's "TVM-DB: no
  obvious speedup"). A pipeline never has more stages in flight than the loop has iterations.
- Util(warps, blocks) = min(1, resident warps × independent FMAs per thread / (4 schedulers × 4-cycle
  FMA latency)). T_compute and T_reg_load are a block's with the SM to itself; the outer pipeline
  shares the SM among its N_mplx resident blocks (see `pipeline_latency`).
- Two throughput floors the latency formula does not see: the batch's bytes per k step over the
  L2/DRAM bandwidth bounds the outer loop, the warps' shared-memory bytes over its bandwidth bound the
  inner one, and T_compute is at least the FMAs plus the shared loads feeding them over the SM's
  issue rate (4 warp instructions per cycle).
- An unfused register pipeline drains and refills once per outer iteration: one T_reg_load more per
  T_smem_use. Fusion (Fig. 5.4) removes it.
- Constants come from published specifications (clocks, lanes, bandwidths, capacities) and
  microbenchmark-scale latencies; `calibrate` fits them to measured kernels.

Pure Python (no pydantic, TVM or Celery) so the GPU benchmark can import it alone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from service.tuning.gpu_parts import GPU_PARTS, GPUPart
from service.tuning.tuners.pipeline.space import WARP, GemmShape, PipelineConfig
from service.tuning.tuners.rank_stats import spearman

_ISSUE_SLOTS = 4 * 4  # 4 warp schedulers per SM × ~4-cycle dependent FMA latency
_REG_GRANULE = 8  # registers are allocated per thread in units of 8
_ISSUE_PER_CLOCK = 4  # warp instructions an SM issues per cycle (one per scheduler)


@dataclass(frozen=True)
class GPUConstants:
    """One GPU's constants for the model. Bandwidths in bytes/s, latencies in seconds."""

    arch: str
    name: str
    sm_count: int
    clock_hz: float
    fp32_lanes_per_sm: int  # FP32 FMA lanes per SM per cycle
    fp16_lanes_per_sm: int  # non-tensor half-precision FMA lanes (half2)
    smem_per_sm: int
    regs_per_sm: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    l2_bytes: int
    dram_bw: float
    dram_write_bw: float
    llc_bw: float
    smem_bytes_per_clock: int  # per SM
    lat_dram_s: float
    lat_llc_s: float
    lat_smem_s: float
    lat_dram_write_s: float
    launch_s: float = 2e-6

    def lanes(self, dtype: str) -> int:
        return self.fp16_lanes_per_sm if dtype == "float16" else self.fp32_lanes_per_sm

    @property
    def smem_bw_per_sm(self) -> float:
        return self.smem_bytes_per_clock * self.clock_hz

    def replaced(self, **fields: Any) -> GPUConstants:
        return dataclasses.replace(self, **fields)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GPUConstants:
        return cls(**{f: data[f] for f in cls.__dataclass_fields__ if f in data})

    @classmethod
    def for_arch(cls, arch: str) -> GPUConstants:
        try:
            return GPU_CONSTANTS[arch]
        except KeyError:
            raise ValueError(f"no pipeline model constants for {arch!r}; known: {', '.join(GPU_CONSTANTS)}") from None

    @classmethod
    def of_part(cls, part: GPUPart) -> GPUConstants | None:
        """The model's view of a part (service.tuning.gpu_parts); None when the part lacks a figure it needs."""
        needed = (part.clock_boost_hz, part.fp32_lanes_per_sm, part.fp16_lanes_per_sm, part.dram_bw, part.llc_bw,
                  part.smem_bytes_per_clock, part.lat_dram_s, part.lat_llc_s, part.lat_smem_s)  # fmt: skip
        if any(v is None for v in needed):
            return None
        assert part.clock_boost_hz and part.fp32_lanes_per_sm and part.fp16_lanes_per_sm and part.dram_bw
        assert part.llc_bw and part.smem_bytes_per_clock and part.lat_dram_s and part.lat_llc_s and part.lat_smem_s
        return cls(
            arch=part.arch, name=part.name, sm_count=part.sm_count, clock_hz=part.clock_boost_hz,
            fp32_lanes_per_sm=part.fp32_lanes_per_sm, fp16_lanes_per_sm=part.fp16_lanes_per_sm,
            smem_per_sm=part.smem_per_sm, regs_per_sm=part.regs_per_sm, max_threads_per_sm=part.max_threads_per_sm,
            max_blocks_per_sm=part.max_blocks_per_sm, l2_bytes=part.l2_bytes, dram_bw=part.dram_bw,
            dram_write_bw=part.dram_bw, llc_bw=part.llc_bw, smem_bytes_per_clock=part.smem_bytes_per_clock,
            lat_dram_s=part.lat_dram_s, lat_llc_s=part.lat_llc_s, lat_smem_s=part.lat_smem_s,
            lat_dram_write_s=part.lat_dram_s,
        )  # fmt: skip

    def with_hardware(self, sm_count: int | None = None, l2_bytes: int | None = None) -> GPUConstants:
        """The same arch with a detected part's SM count and L2 (an A100 PCIe, an H100 PCIe with 114 SMs)."""
        return dataclasses.replace(
            self, sm_count=sm_count or self.sm_count, l2_bytes=l2_bytes if l2_bytes is not None else self.l2_bytes
        )


# The model's view of each arch's part that has every figure it needs (service.tuning.gpu_parts: boost clock, lanes,
# bandwidths, latency estimates that `calibrate` replaces with fitted values).
GPU_CONSTANTS: dict[str, GPUConstants] = {
    arch: constants for arch, part in GPU_PARTS.items() if (constants := GPUConstants.of_part(part)) is not None
}

Bound = Literal["compute", "load"]


def pipeline_latency(t_load: float, t_use: float, n_loop: int, n_pipe: int, n_mplx: int) -> tuple[float, Bound]:
    """ALCOP's pipeline latency model (Table 5.1) and which case applied.

    `t_use` is one stream's use phase with the SM to itself (one warp at the register level, one block
    at the shared level); the SM runs `n_mplx` streams, so a compute-bound loop takes n_mplx · t_use per
    iteration. With n_mplx = 1 this is Table 5.1 verbatim; reading T_use as the SM's time for all
    streams keeps the two cases continuous where they meet (otherwise a faster use phase can flip a loop
    into the load-bound case and predict it slower).
    """
    if t_load <= (n_pipe * n_mplx - 1) * t_use:
        return n_mplx * t_use * n_loop, "compute"
    return (t_load + t_use) * n_loop / n_pipe, "load"


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int  # what the resources allow (0: the block does not fit an SM)
    limited_by: str
    blocks: int  # thread blocks in the grid
    batches: int  # thread-block batches (waves)
    blocks_per_batch: int
    resident_per_sm: int  # N_mplx of the outer pipeline: blocks sharing an SM in a batch


def occupancy(shape: GemmShape, config: PipelineConfig, gpu: GPUConstants) -> Occupancy:
    regs_per_thread = math.ceil(config.registers_per_thread / _REG_GRANULE) * _REG_GRANULE
    smem = config.smem_bytes(shape.dtype_bytes)
    limits = {
        "shared memory": gpu.smem_per_sm // smem if smem else gpu.max_blocks_per_sm,
        "registers": gpu.regs_per_sm // (regs_per_thread * config.threads),
        "threads": gpu.max_threads_per_sm // config.threads,
        "block slots": gpu.max_blocks_per_sm,
    }
    limited_by = min(limits, key=lambda k: limits[k])
    per_sm = limits[limited_by]
    blocks = shape.batch * math.ceil(shape.m / config.bm) * math.ceil(shape.n / config.bn)
    if per_sm < 1:
        return Occupancy(0, limited_by, blocks, 0, 0, 0)
    slots = gpu.sm_count * per_sm
    per_batch = min(blocks, slots)
    return Occupancy(
        blocks_per_sm=per_sm,
        limited_by=limited_by,
        blocks=blocks,
        batches=math.ceil(blocks / slots),
        blocks_per_batch=per_batch,
        resident_per_sm=math.ceil(per_batch / gpu.sm_count),
    )


def batch_working_set(shape: GemmShape, config: PipelineConfig, blocks_per_batch: int) -> int:
    """Distinct bytes of A and B one k-step of a thread-block batch reads: blocks run in launch order,
    column tiles fastest, so a batch shares B tiles across its rows of blocks and A tiles along a row."""
    n_tiles = math.ceil(shape.n / config.bn)
    m_tiles = math.ceil(shape.m / config.bm)
    rows = math.ceil(blocks_per_batch / n_tiles)  # distinct (batch, m-tile) rows
    cols = min(blocks_per_batch, n_tiles)
    batches = math.ceil(rows / m_tiles)  # batch_matmul: every batch index has its own B
    return (rows * config.bm + batches * cols * config.bn) * config.bk * shape.dtype_bytes


def _warp_smem_bytes(config: PipelineConfig, dtype_bytes: int) -> int:
    """Shared-memory bytes one warp reads per inner k step: threads of a warp that share a row (column)
    of the block tile read the same A (B) elements, which shared memory broadcasts."""
    cols = config.bn // config.tn  # threads across the tile's columns (threadIdx.x fastest)
    wx = min(WARP, cols)
    wy = max(1, WARP // wx)
    return (wy * config.tm + wx * config.tn) * dtype_bytes


@dataclass(frozen=True)
class Prediction:
    seconds: float  # T_kernel; inf when the block does not fit an SM
    occupancy: Occupancy
    t_threadblock: float = math.inf
    t_init: float = 0.0
    t_main_loop: float = 0.0
    t_epilogue: float = 0.0
    t_smem_load: float = 0.0
    t_llc_load: float = 0.0
    t_dram_load: float = 0.0
    t_smem_use: float = 0.0
    t_reg_load: float = 0.0
    t_compute: float = 0.0
    util: float = 0.0
    working_set_bytes: int = 0
    smem_bound: Bound | None = None
    reg_bound: Bound | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["occupancy"] = dataclasses.asdict(self.occupancy)
        return out


def predict(shape: GemmShape, config: PipelineConfig, gpu: GPUConstants) -> Prediction:
    """T_kernel for `config` on `shape`, with every term of Table 5.1 (for a full batch).

    Full batches each take T_threadblk; a last, partial batch has fewer blocks per SM and shares the
    L2 and DRAM among fewer blocks, so it is modelled with its own T_threadblk rather than a full one.
    """
    occ = occupancy(shape, config, gpu)
    if occ.blocks_per_sm == 0:
        return Prediction(seconds=math.inf, occupancy=occ)
    full = threadblock(shape, config, gpu, occ, occ.blocks_per_batch)
    slots = gpu.sm_count * occ.blocks_per_sm
    whole, rest = divmod(occ.blocks, slots)
    last = threadblock(shape, config, gpu, occ, rest).t_threadblock if rest and whole else 0.0
    t_kernel = full.t_threadblock * (whole or 1) + last + gpu.launch_s
    return dataclasses.replace(full, seconds=t_kernel)


def threadblock(
    shape: GemmShape, config: PipelineConfig, gpu: GPUConstants, occ: Occupancy, blocks_in_batch: int
) -> Prediction:
    """T_threadblk and its terms for a batch of `blocks_in_batch` resident blocks (`seconds` = T_threadblk)."""
    nbytes = shape.dtype_bytes
    mplx = math.ceil(blocks_in_batch / gpu.sm_count)
    # -- register level: one inner k step of the block, with the SM to itself ---------------------
    util = min(1.0, config.warps * mplx * config.tm * config.tn / _ISSUE_SLOTS)  # all resident warps hide latency
    block_flops_per_s = 2 * gpu.lanes(shape.dtype) * gpu.clock_hz * util
    # every FMA shares the SM's issue slots with the shared-memory loads that feed it
    instructions = config.warps * (config.tm * config.tn + config.tm + config.tn)
    t_issue = instructions / (_ISSUE_PER_CLOCK * gpu.clock_hz)
    t_compute = max(2 * config.bm * config.bn / block_flops_per_s, t_issue)
    smem_transfer = config.warps * _warp_smem_bytes(config, nbytes) / gpu.smem_bw_per_sm
    t_reg_load = gpu.lat_smem_s + smem_transfer
    n_reg_loop = config.bk
    t_smem_use, reg_bound = pipeline_latency(
        t_reg_load, t_compute / config.warps, n_reg_loop, min(config.reg_stages, n_reg_loop), config.warps
    )
    t_smem_use = max(t_smem_use, smem_transfer * n_reg_loop)  # bandwidth shared by all warps bounds it
    if config.reg_stages > 1 and not config.fuse_inner:
        t_smem_use += t_reg_load  # the inner pipeline's prologue, once per outer iteration
    # -- shared-memory level: one outer k step ---------------------------------------------------
    per_block = (config.bm + config.bn) * config.bk * nbytes
    t_llc = gpu.lat_llc_s + per_block * blocks_in_batch / gpu.llc_bw
    working_set = batch_working_set(shape, config, blocks_in_batch)
    t_dram = gpu.lat_dram_s + working_set / gpu.dram_bw
    t_smem_load = max(t_llc, t_dram)
    n_smem_loop = math.ceil(shape.k / config.bk)
    n_pipe = min(config.smem_stages if config.async_copy else 1, n_smem_loop)
    t_main, smem_bound = pipeline_latency(t_smem_load, t_smem_use, n_smem_loop, n_pipe, mplx)
    # T_LLC/T_DRAM count the whole batch's bytes: however well latency is hidden, a k step of the
    # batch cannot finish faster than its bytes cross the L2 and DRAM
    t_bandwidth = max(t_llc - gpu.lat_llc_s, t_dram - gpu.lat_dram_s)
    t_main = max(t_main, t_bandwidth * n_smem_loop)
    # -- the block and the kernel ----------------------------------------------------------------
    t_init = t_smem_load + t_reg_load
    out_tile = config.bm * config.bn * nbytes
    t_epilogue = gpu.lat_dram_write_s + out_tile * blocks_in_batch / gpu.dram_write_bw
    t_block = t_init + t_main + t_epilogue
    return Prediction(
        seconds=t_block,
        occupancy=occ,
        t_threadblock=t_block,
        t_init=t_init,
        t_main_loop=t_main,
        t_epilogue=t_epilogue,
        t_smem_load=t_smem_load,
        t_llc_load=t_llc,
        t_dram_load=t_dram,
        t_smem_use=t_smem_use,
        t_reg_load=t_reg_load,
        t_compute=t_compute,
        util=util,
        working_set_bytes=working_set,
        smem_bound=smem_bound,
        reg_bound=reg_bound,
    )


def rank(shape: GemmShape, configs: Iterable[PipelineConfig], gpu: GPUConstants) -> list[tuple[PipelineConfig, float]]:
    """Configurations with their predicted seconds, fastest first (ties keep input order)."""
    scored = [(c, predict(shape, c, gpu).seconds) for c in configs]
    return sorted(scored, key=lambda item: item[1])


def rank_correlation(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Spearman ρ of predicted against measured latency (1.0: the model orders them exactly)."""
    return spearman(predicted, measured)


def best_in_top_k(ranked_measured: Sequence[float], k: int, best: float | None = None) -> float:
    """ALCOP's best-in-top-k: best latency among the first k proposals (in proposal order), as a share
    of the best found (1.0: the k-th proposal or earlier hit the optimum). `best` defaults to the best
    among all measured proposals."""
    finite = [s for s in ranked_measured if math.isfinite(s)]
    if not finite:
        return 0.0
    top = [s for s in ranked_measured[:k] if math.isfinite(s)]
    optimum = best if best is not None else min(finite)
    return optimum / min(top) if top else 0.0


# -- calibration ---------------------------------------------------------------------------------

Sample = tuple[GemmShape, PipelineConfig, float]  # a measured kernel: shape, configuration, seconds
CALIBRATED = ("clock_hz", "llc_bw", "dram_bw", "lat_dram_s", "lat_llc_s", "launch_s")
_SCALES = (0.25, 0.4, 0.5, 0.63, 0.8, 0.9, 1.0, 1.1, 1.25, 1.6, 2.0, 2.5, 4.0)


def log_error(gpu: GPUConstants, samples: Sequence[Sample]) -> float:
    """Mean squared log ratio of predicted to measured seconds (scale-free, robust to a few outliers)."""
    total = 0.0
    for shape, config, seconds in samples:
        predicted = predict(shape, config, gpu).seconds
        total += math.log(predicted / seconds) ** 2 if math.isfinite(predicted) else 100.0
    return total / len(samples)


def calibrate(
    gpu: GPUConstants, samples: Sequence[Sample], fields: Sequence[str] = CALIBRATED, rounds: int = 3
) -> tuple[GPUConstants, float, float]:
    """Fit `fields` to measured kernels by coordinate descent over multiplicative scales.

    Returns (calibrated constants, log error before, log error after). Capacities (SMs, shared
    memory, registers) are facts of the part and are never fitted.
    """
    usable = [s for s in samples if s[2] > 0 and math.isfinite(s[2])]
    if len(usable) < 2:
        raise ValueError("calibration needs at least two measured kernels")
    before = best_error = log_error(gpu, usable)
    best = gpu
    for _ in range(rounds):
        improved = False
        for name in fields:
            base = getattr(best, name)
            for scale in _SCALES:
                trial = best.replaced(**{name: base * scale})
                err = log_error(trial, usable)
                if err < best_error - 1e-12:
                    best, best_error, improved = trial, err, True
        if not improved:
            break
    return best, before, best_error
