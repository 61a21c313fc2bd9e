"""FTuner's GPU rules: candidate uKernels (pipelined thread-block tiles) for dense Y[M,N] = X[M,K]·W[N,K]ᵀ.

No search and no measurement: every tile of `GPURuleLimits`' grid is checked against the hardware model
(service.tuning.hardware_model, one record per GPU) and the survivors are ranked
analytically, as FTuner derives its uKernels from per-GPU register / shared-memory / SM counts
(../shared/research/anchors.md §1.2). The tile is what service.tuning.tuners.pipeline.schedule compiles
(one binary over a symbolic M): a bm×bn block tile stepping bk along K through `stages` shared-memory
buffers, each thread holding a tm×tn accumulator.

Rules, each of which a candidate must pass:
  (a) warp alignment  threads per block (bm/tm)·(bn/tn) a whole number of warps, ≤ the block limit; bk
                      a multiple of the 16-byte copy vector, bn divides N, bk·split_k divides K;
  (b) registers       ~tm·tn + tm + tn + 24 per thread ≤ 255, and ·threads ≤ registers per block;
  (c) shared memory   stages·(bm + bn)·(bk + pad)·bytes ≤ the static per-block limit (48 KiB), the rows
                      padded to a conflict-free pitch (schedule.conflict_free_pad) and counted;
  (d) occupancy       resident blocks per SM (bounded by threads, registers, shared memory per SM and the
                      block limit) ≥ 1, and the resident warps cover at least `min_warps_per_sm`;
  (e) parallelism     ceil(M/bm)·(N/bn)·split_k thread blocks at a representative M give every SM one;
  (f) split-K         only when M·N alone yields fewer blocks than SMs (gpu.md §5: on the H100 36 blocks
                      for 132 SMs was the hand kernel's whole problem), and then the smallest split that
                      fills the SMs while leaving ≥ stages k-steps per slice.
Rule (e) is relaxed when no tile passes it (tiny N·M on a big GPU), and the candidates say so.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass

from service.tuning.hardware_model import HardwareModel
from service.tuning.tuners.pipeline.schedule import GemmTile, conflict_free_pad
from service.tuning.tuners.ukernel.rules import wave_efficiency

_BYTES = {"float32": 4, "float16": 2}
MAX_REGS_PER_THREAD = 255


@dataclass(frozen=True)
class GPURuleLimits:
    bm: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    bn: tuple[int, ...] = (16, 24, 32, 48, 64, 96, 128)
    bk: tuple[int, ...] = (16, 32, 48, 64)
    thread_tiles: tuple[tuple[int, int], ...] = ((1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (4, 2), (4, 4), (8, 4), (8, 8))
    split_k: tuple[int, ...] = (2, 4, 8, 16)
    stages: int = 3  # the rules' default depth; the tuner searches 1..max_stages per uKernel on a GPU
    max_stages: int = 4
    min_warps_per_sm: int = 4  # below this an SM cannot hide memory latency even with cp.async


@dataclass(frozen=True)
class GPUTileCandidate:
    tile: GemmTile
    score: float
    blocks: int  # thread blocks at the representative M
    blocks_per_sm: int  # resident at once
    occupancy: float  # resident warps / the SM's maximum
    registers: int  # per thread, estimated
    smem_bytes: int
    representative_m: int
    reasons: tuple[str, ...]


def resident_blocks(hw: HardwareModel, tile: GemmTile, dtype: str = "float32") -> tuple[int, str]:
    """Thread blocks one SM holds at once, and which resource limits it."""
    threads = tile.threads
    regs = tile.registers_estimate() * threads
    smem = tile.smem_bytes(dtype)
    limits = {
        "blocks": hw.max_blocks_per_sm,
        "threads": hw.max_threads_per_sm // threads if threads else 0,
        "registers": hw.regs_per_sm // regs if regs else 0,
        "shared memory": hw.smem_per_sm // smem if smem else hw.max_blocks_per_sm,
    }
    bound = min(limits, key=lambda key: limits[key])
    return limits[bound], bound


def grid_blocks(m: int, n: int, tile: GemmTile) -> int:
    return math.ceil(m / tile.bm) * (n // tile.bn) * tile.split_k


def choose_split_k(hw: HardwareModel, m: int, n: int, k: int, tile: GemmTile, limits: GPURuleLimits) -> int:
    """Rule (f): 1 when M·N fills the SMs, else the smallest split that does (or the largest that fits K)."""
    if grid_blocks(m, n, tile) >= hw.sm_count:
        return 1
    best = 1
    for split in limits.split_k:
        if k % (tile.bk * split) or k // (tile.bk * split) < max(tile.stages, 1):
            break
        best = split
        if math.ceil(m / tile.bm) * (n // tile.bn) * split >= hw.sm_count:
            break
    return best


def check_gpu_tile(
    hw: HardwareModel,
    n: int,
    k: int,
    tile: GemmTile,
    m: int,
    dtype: str = "float32",
    limits: GPURuleLimits | None = None,
) -> tuple[bool, bool, list[str]]:
    """(passes rules a–d and f, passes rule e, one line per rule saying why)."""
    limits = limits or GPURuleLimits()
    reasons: list[str] = []
    lanes = 16 // _BYTES[dtype]
    threads = tile.threads
    shape_problem = tile.problem(n, k)
    warp_ok = (
        shape_problem is None
        and threads % hw.warp_size == 0
        and threads <= hw.max_threads_per_block
        and tile.bk % lanes == 0
    )
    reasons.append(
        f"warp alignment{'' if warp_ok else ' FAIL'}: {threads} threads = {threads / hw.warp_size:g} warps, "
        f"bk={tile.bk} vs {lanes}-element copies" + (f"; {shape_problem}" if shape_problem else "")
    )
    regs = tile.registers_estimate()
    regs_ok = regs <= MAX_REGS_PER_THREAD and regs * threads <= hw.regs_per_block
    reasons.append(
        f"registers{'' if regs_ok else ' FAIL'}: ~{regs}/thread × {threads} = {regs * threads}/{hw.regs_per_block}"
    )
    smem = tile.smem_bytes(dtype)
    smem_ok = smem <= hw.smem_per_block
    reasons.append(
        f"shared memory{'' if smem_ok else ' FAIL'}: {tile.stages} stages × tiles = {smem} B/{hw.smem_per_block} B"
    )
    resident, bound = resident_blocks(hw, tile, dtype)
    warps = resident * threads // hw.warp_size
    occ_ok = resident >= 1 and warps >= min(limits.min_warps_per_sm, hw.max_threads_per_sm // hw.warp_size)
    reasons.append(
        f"occupancy{'' if occ_ok else ' FAIL'}: {resident} blocks/SM ({bound}-bound), {warps} warps "
        f"of {hw.max_threads_per_sm // hw.warp_size}"
    )
    unsplit = with_split_k(tile, 1)
    needs_split = grid_blocks(m, n, unsplit) < hw.sm_count
    split_ok = tile.split_k == 1 or needs_split
    reasons.append(
        f"split-K{'' if split_ok else ' FAIL'}: split {tile.split_k}, "
        f"{grid_blocks(m, n, unsplit)} blocks without it for {hw.sm_count} SMs"
    )
    blocks = grid_blocks(m, n, tile)
    fills = blocks >= hw.sm_count
    reasons.append(
        f"parallelism{'' if fills else ' FAIL'}: {blocks} blocks at M={m} for {hw.sm_count} SMs "
        f"(wave efficiency {wave_efficiency(blocks, hw.sm_count * max(resident, 1)):.2f})"
    )
    return warp_ok and regs_ok and smem_ok and occ_ok and split_ok, fills, reasons


def with_split_k(tile: GemmTile, split_k: int) -> GemmTile:
    return dataclasses.replace(tile, split_k=split_k)


# The model's two machine balances, arch-agnostic on purpose (ranks tiles, does not predict µs): an SM
# does ~10 fp32 FMAs in the time DRAM delivers a byte (H100: 67 TFLOP/s vs 3.35 TB/s; A100: 19.5 vs 1.6),
# and re-reads that hit L2 cost about a third of a DRAM read.
FMAS_PER_DRAM_BYTE = 10.0
L2_COST = 1.0 / 3.0


def estimated_time(hw: HardwareModel, n: int, k: int, tile: GemmTile, m: int, dtype: str = "float32") -> float:
    """Relative time of one call (in DRAM-byte units): max(memory, math), spread over the SMs the grid fills.

    Memory: X, W and Y once from DRAM, every other tile re-read from L2, plus split-K's partial sums
    written and read back. Math: the padded rows' FMAs, slowed when the thread tile reuses registers
    little (tm·tn/(tm+tn) FMAs per shared-memory load). Both scale with the share of SMs the grid keeps
    busy, counting a last, partly empty wave of resident blocks."""
    size = _BYTES[dtype]
    row_blocks, col_blocks = math.ceil(m / tile.bm), n // tile.bn
    m_pad = row_blocks * tile.bm
    unique = (m * k + n * k + m * n) * size
    reread = (m_pad * k * col_blocks + n * k * row_blocks) * size - (m * k + n * k) * size
    partials = 2 * tile.split_k * m_pad * n * 4 if tile.split_k > 1 else 0
    memory = unique + L2_COST * (max(reread, 0) + partials)
    reuse = tile.tm * tile.tn / (tile.tm + tile.tn)
    math_time = m_pad * n * k / FMAS_PER_DRAM_BYTE / (reuse / (reuse + 0.5))
    resident, _ = resident_blocks(hw, tile, dtype)
    blocks = grid_blocks(m, n, tile)
    busy = min(1.0, blocks / hw.sm_count) * wave_efficiency(blocks, hw.sm_count * max(resident, 1))
    return max(memory, math_time) / busy


def score_tile(hw: HardwareModel, n: int, k: int, tile: GemmTile, m: int, dtype: str = "float32") -> float:
    """Useful FMAs per unit of estimated time (higher is better)."""
    return m * n * k / estimated_time(hw, n, k, tile, m, dtype)


def gpu_candidates(
    hw: HardwareModel,
    n: int,
    k: int,
    representative_m: int = 128,
    dtype: str = "float32",
    top_k: int = 4,
    limits: GPURuleLimits | None = None,
    per_bm: int = 1,
) -> list[GPUTileCandidate]:
    """The best `top_k` tiles for one representative M, at most `per_bm` of each bm (the static model's
    screen asks for a wide pool: gpu_screen.model_ukernels)."""
    limits = limits or GPURuleLimits()
    if hw.kind != "gpu":
        raise ValueError("GPU rules need a GPU hardware model (HardwareModel.for_gpu / GPUDescription.hardware_model)")
    if dtype not in _BYTES:
        raise ValueError(f"unsupported dtype {dtype!r}")
    filling: list[GPUTileCandidate] = []
    underfilling: list[GPUTileCandidate] = []
    for bm in limits.bm:
        for bn in limits.bn:
            if n % bn:
                continue
            for tm, tn in limits.thread_tiles:
                if bm % tm or bn % tn:
                    continue
                for bk in limits.bk:
                    # padded rows and interleaved columns: conflict-free shared reads (gpu_model.gate checks)
                    tile = GemmTile(
                        bm,
                        bn,
                        bk,
                        tm,
                        tn,
                        stages=limits.stages,
                        async_copy=hw.async_copy,
                        pad=conflict_free_pad(bk, dtype),
                        interleave=tn > 1,
                    )
                    if tile.problem(n, k):
                        continue
                    tile = with_split_k(tile, choose_split_k(hw, representative_m, n, k, tile, limits))
                    ok, fills, reasons = check_gpu_tile(hw, n, k, tile, representative_m, dtype, limits)
                    if not ok:
                        continue
                    resident, _ = resident_blocks(hw, tile, dtype)
                    cand = GPUTileCandidate(
                        tile=tile,
                        score=score_tile(hw, n, k, tile, representative_m, dtype),
                        blocks=grid_blocks(representative_m, n, tile),
                        blocks_per_sm=resident,
                        occupancy=resident * tile.threads / hw.max_threads_per_sm,
                        registers=tile.registers_estimate(),
                        smem_bytes=tile.smem_bytes(dtype),
                        representative_m=representative_m,
                        reasons=tuple(reasons),
                    )
                    (filling if fills else underfilling).append(cand)
    pool = filling or [
        GPUTileCandidate(**{**c.__dict__, "reasons": (*c.reasons, "parallelism relaxed: no tile fills the SMs")})
        for c in underfilling
    ]
    pool.sort(key=lambda c: (-round(c.score, 9), c.tile.split_k, -c.tile.bk, c.tile.label()))
    kept: list[GPUTileCandidate] = []
    per: dict[int, int] = {}
    for cand in pool:
        if per.get(cand.tile.bm, 0) < per_bm:
            per[cand.tile.bm] = per.get(cand.tile.bm, 0) + 1
            kept.append(cand)
    return sorted(kept, key=lambda c: -c.score)[:top_k]


def gpu_ukernels(
    hw: HardwareModel,
    n: int,
    k: int,
    representative_ms: Iterable[int] = (1, 16, 64, 128, 512),
    dtype: str = "float32",
    per_m: int = 2,
    limits: GPURuleLimits | None = None,
) -> list[GPUTileCandidate]:
    """The uKernel set for a dynamic M: the best tiles at each representative M, deduplicated.

    A tile is compiled once and serves every M; the combination step then picks per M which uKernel
    (small bm + split-K at small M, big bm at large M) runs which part of the rows."""
    seen: dict[GemmTile, GPUTileCandidate] = {}
    for m in representative_ms:
        for cand in gpu_candidates(hw, n, k, m, dtype, per_m, limits):
            seen.setdefault(cand.tile, cand)
    return list(seen.values())
