"""Analytic rankers for uKernels at a shape S, so a shape needs no measurement of its own.

- DietCode's micro-kernel model: a uKernel's time is its measured time per M-tile, f_MK, times the
  M-tiles S needs, divided by how well those tiles' tasks fill the cores (a partial last wave still
  costs a whole wave). One measurement per uKernel predicts every S.
- FTuner's Synthesis Index Analysis (SIA): a unitless score from the tile's compute-to-memory ratio,
  the useful share of rows after padding, and core utilisation, combined as a weighted geometric
  product. It needs no measurement at all. FTuner's released code scores measured throughput ×
  occupancy × padding (../shared/research/anchors.md §1.3); with throughput unknown, the tile's
  compute-to-memory ratio stands in for it.
- `spearman` checks either ranking against measurements (FTuner's own SIA scores reach ρ≈0.33–0.42 for
  small M and 0.74–0.82 for M ≥ 62 on V100, per anchors.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from service.tuning.tuners.rank_stats import spearman as spearman  # re-exported: ukernel callers import it here
from service.tuning.tuners.ukernel.rules import padding_efficiency, wave_efficiency


def tasks(S: int, mt: int, nt: int, N: int) -> int:
    """Parallel (M-tile × N-tile) tasks of one uKernel call on S rows."""
    return math.ceil(S / mt) * math.ceil(N / nt)  # N padded to a multiple of nt when nt does not divide it


def f_mk_from_measurement(seconds: float, M: int, mt: int, nt: int, N: int, cores: int) -> float:
    """DietCode's f_MK: seconds per M-tile on a fully occupied machine, from one timing at M rows."""
    return seconds * wave_efficiency(tasks(M, mt, nt, N), cores) / math.ceil(M / mt)


def dietcode_predict(f_mk: float, S: int, mt: int, nt: int, N: int, cores: int) -> float:
    """predicted(S) = f_MK × ceil(S/mt) × occupancy penalty, the penalty being 1 / wave efficiency."""
    return f_mk * math.ceil(S / mt) / wave_efficiency(tasks(S, mt, nt, N), cores)


def compute_to_memory(mt: int, nt: int, K: int, dtype_bytes: int = 4) -> float:
    """FLOPs per byte of one task: 2·mt·nt·K FLOPs over its X panel, W panel and Y tile."""
    return 2 * mt * nt * K / ((mt * K + K * nt + mt * nt) * dtype_bytes)


@dataclass(frozen=True)
class SIAWeights:
    """Exponents of the geometric product; FTuner calibrates its occupancy weight per device."""

    intensity: float = 1.0
    padding: float = 1.0
    utilisation: float = 1.0


def sia_score(
    mt: int, nt: int, S: int, N: int, K: int, cores: int, cmr_ref: float, weights: SIAWeights = SIAWeights()
) -> float:
    """(CMR / cmr_ref, capped at 1)^a × (S / padded S)^b × (wave efficiency)^c; higher is better.

    `cmr_ref` normalises the compute-to-memory ratio: the best among the candidates being compared,
    or the machine balance (peak FLOP/s ÷ bandwidth) when that is known.
    """
    cmr = min(1.0, compute_to_memory(mt, nt, K) / cmr_ref)
    pad = padding_efficiency(S, mt)
    util = wave_efficiency(tasks(S, mt, nt, N), cores)
    return float(cmr**weights.intensity * pad**weights.padding * util**weights.utilisation)


def rank_sia(
    tiles: Sequence[tuple[int, int]], S: int, N: int, K: int, cores: int, weights: SIAWeights = SIAWeights()
) -> list[tuple[tuple[int, int], float]]:
    """(mt, nt) tiles with their SIA scores at S, best first (ties keep input order)."""
    ref = max(compute_to_memory(mt, nt, K) for mt, nt in tiles)
    scored = [((mt, nt), sia_score(mt, nt, S, N, K, cores, ref, weights)) for mt, nt in tiles]
    return sorted(scored, key=lambda item: -item[1])
