"""FTuner-style uKernel candidates for dense Y[M,N] = X[M,K]·W[N,K]ᵀ with a dynamic M, from rules only.

No search and no measurement: every (mt, nt, kt) register/cache tile is checked against the hardware
model and the survivors are ranked analytically (../shared/research/anchors.md §1.2). The tile is
the one `kernel.py` compiles: an mt×nt accumulator held in vector registers, a K loop stepped kt at a
time with ii, ki and the nt/lanes vectors all unrolled, and (M-tile × N-tile) tasks run in parallel.

Rules, each of which a candidate must pass:
  (a) alignment     nt is a multiple of the vector lanes (no partial vectors) and divides N; when no
                    such nt divides N (N = 1000 with 16 lanes), N is padded up to a multiple of nt
                    inside the kernel and the tile's score pays for the padded columns;
  (b) registers     mt·(nt/lanes) accumulators + nt/lanes W loads + 1 X broadcast ≤ vector registers,
                    or LLVM spills the accumulators and the tile loses its point;
  (c) cache         kt divides K and one k-step's operands, (mt·kt + kt·nt)·bytes, fit a fraction of L1;
  (d) unrolling     mt·(nt/lanes)·kt unrolled FMAs stay under a budget (code size, compile time);
  (e) parallelism   ceil(M/mt)·(N/nt) tasks at a representative M give every core work.
Rule (e) is relaxed when no tile passes it (tiny N and M cannot fill many cores), as FTuner relaxes
its occupancy filter, and the candidates say so.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from service.tuning.hardware_model import HardwareModel

_BYTES = {"float32": 4, "float16": 2}


@dataclass(frozen=True)
class RuleLimits:
    max_mt: int = 32
    max_kt: int = 16
    l1_fraction: float = 0.5  # the rest of L1 holds the streamed X/W panels' next lines and the stack
    unroll_budget: int = 128  # vector FMAs in the fully unrolled k-step body


@dataclass(frozen=True)
class UKernelCandidate:
    mt: int
    nt: int
    kt: int
    score: float
    registers: int  # vector registers the inner loop needs
    l1_tile_bytes: int
    tasks: int  # parallel (M-tile × N-tile) tasks at the representative M
    intensity: float  # vector FMAs per register load in one k step
    reasons: tuple[str, ...]

    @property
    def tile(self) -> tuple[int, int, int]:
        return (self.mt, self.nt, self.kt)


def intensity(mt: int, vectors: int) -> float:
    """FMAs per load in one k step: mt·v FMAs need v W-vector loads and mt X broadcasts."""
    return mt * vectors / (mt + vectors)


def wave_efficiency(tasks: int, cores: int) -> float:
    """Share of core-slots doing work when tasks run in waves of `cores` (FTuner's occupancy G/ceil_to(G,#SM))."""
    return tasks / (math.ceil(tasks / cores) * cores)


def padding_efficiency(m: int, mt: int) -> float:
    """Useful share of the rows computed when M is padded up to a multiple of mt (the same for N and nt)."""
    return m / padded(m, mt)


def padded(n: int, tile: int) -> int:
    return math.ceil(n / tile) * tile


def check_tile(
    hw: HardwareModel,
    n: int,
    k: int,
    mt: int,
    nt: int,
    kt: int,
    representative_m: int,
    dtype: str = "float32",
    limits: RuleLimits = RuleLimits(),
    pad_n: bool = False,
) -> tuple[bool, bool, list[str]]:
    """(passes rules a–d, passes rule e, one line per rule saying why). Separate so callers can explain rejections.

    `pad_n`: N may be padded to a multiple of nt (used when no lane-aligned nt divides N)."""
    lanes = hw.lanes(dtype)
    reasons: list[str] = []
    ok = True
    if nt % lanes or (n % nt and not pad_n):
        ok = False
        reasons.append(f"alignment FAIL: nt={nt} must be a multiple of {lanes} lanes and divide N={n}")
    elif n % nt:
        reasons.append(
            f"alignment: nt={nt} = {nt // lanes}×{lanes} lanes; no lane-aligned nt divides N={n}, "
            f"so N is padded to {padded(n, nt)} ({padding_efficiency(n, nt):.3f} useful)"
        )
    else:
        reasons.append(f"alignment: nt={nt} = {nt // lanes}×{lanes} lanes, divides N={n}")
    vectors = max(nt // lanes, 1)
    regs = mt * vectors + vectors + 1
    verdict = "" if regs <= hw.vector_registers else " FAIL"
    ok &= regs <= hw.vector_registers
    reasons.append(
        f"registers{verdict}: {mt * vectors} accumulators + {vectors} W + 1 broadcast = {regs}/{hw.vector_registers}"
    )
    tile_bytes = (mt * kt + kt * nt) * _BYTES[dtype]
    budget = int(hw.l1_bytes * limits.l1_fraction)
    cache_ok = k % kt == 0 and tile_bytes <= budget
    ok &= cache_ok
    reasons.append(
        f"cache{'' if cache_ok else ' FAIL'}: kt={kt} {'divides' if k % kt == 0 else 'does not divide'} K={k}, "
        f"k-step operands {tile_bytes} B vs {budget} B ({limits.l1_fraction:g} of L1)"
    )
    unrolled = mt * vectors * kt
    ok &= unrolled <= limits.unroll_budget
    reasons.append(
        f"unroll{'' if unrolled <= limits.unroll_budget else ' FAIL'}: {unrolled} FMAs/{limits.unroll_budget}"
    )
    tasks = math.ceil(representative_m / mt) * (math.ceil(n / nt) if nt else 0)
    fills = tasks >= hw.cores
    reasons.append(
        f"parallelism{'' if fills else ' FAIL'}: {tasks} tasks at M={representative_m} for {hw.cores} cores "
        f"(wave efficiency {wave_efficiency(max(tasks, 1), hw.cores):.2f})"
    )
    return ok, fills, reasons


def dense_candidates(
    hw: HardwareModel,
    n: int,
    k: int,
    representative_m: int = 128,
    dtype: str = "float32",
    top_k: int = 8,
    limits: RuleLimits = RuleLimits(),
    distinct_mt: bool = False,
) -> list[UKernelCandidate]:
    """The best `top_k` tiles, ranked by intensity × wave efficiency × padding efficiency at `representative_m`.

    One kt per (mt, nt): the largest that passes, since a longer unrolled k step only saves loop
    overhead and the register tile is what sets speed. `distinct_mt` keeps the best tile per mt,
    which is what the combination step wants (different M-tiles cover different remainders).
    """
    if hw.kind != "cpu":
        raise ValueError("uKernel rules are implemented for CPU targets only (GPU rules are future work)")
    if dtype not in _BYTES:
        raise ValueError(f"unsupported dtype {dtype!r}")
    lanes = hw.lanes(dtype)
    filling: list[UKernelCandidate] = []
    underfilling: list[UKernelCandidate] = []
    # N padded only when it must be: a dividing nt wastes nothing, so it is preferred whenever one exists
    pad_n = not any(n % nt == 0 for nt in range(lanes, n + 1, lanes))
    for nt in range(lanes, padded(n, lanes) + 1, lanes):
        if n % nt and not pad_n:
            continue
        for mt in range(1, limits.max_mt + 1):
            best: tuple[UKernelCandidate, bool] | None = None
            for kt in range(min(limits.max_kt, k), 0, -1):
                ok, fills, reasons = check_tile(hw, n, k, mt, nt, kt, representative_m, dtype, limits, pad_n)
                if ok:
                    best = (_candidate(hw, n, mt, nt, kt, representative_m, dtype, reasons, fills), fills)
                    break
            if best is not None:
                (filling if best[1] else underfilling).append(best[0])
    pool = filling or [
        dataclasses.replace(c, reasons=(*c.reasons, "parallelism relaxed: no tile fills the cores"))
        for c in underfilling
    ]
    pool.sort(key=lambda c: (-round(c.score, 12), -c.mt * c.nt, c.mt, c.nt, c.kt))
    if distinct_mt:
        per_mt: dict[int, UKernelCandidate] = {}
        for c in pool:
            per_mt.setdefault(c.mt, c)  # pool is sorted, so the first per mt is its best
        pool = list(per_mt.values())
    return pool[:top_k]


def _candidate(
    hw: HardwareModel,
    n: int,
    mt: int,
    nt: int,
    kt: int,
    m: int,
    dtype: str,
    reasons: list[str],
    fills: bool,
) -> UKernelCandidate:
    vectors = nt // hw.lanes(dtype)
    tasks = math.ceil(m / mt) * math.ceil(n / nt)
    inten = intensity(mt, vectors)
    pad = padding_efficiency(m, mt) * padding_efficiency(n, nt)  # the N factor is 1 unless N is padded
    wave = wave_efficiency(tasks, hw.cores)
    score = inten * pad * wave
    return UKernelCandidate(
        mt=mt,
        nt=nt,
        kt=kt,
        score=score,
        registers=mt * vectors + vectors + 1,
        l1_tile_bytes=(mt * kt + kt * nt) * _BYTES[dtype],
        tasks=tasks,
        intensity=inten,
        reasons=(*reasons, f"score {score:.3f} = intensity {inten:.3f} × padding {pad:.3f} × waves {wave:.3f}"),
    )
