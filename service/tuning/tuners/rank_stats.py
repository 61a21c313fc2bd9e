"""Rank statistics shared by the analytical models (uKernel rankers, ALCOP's pipeline model).

Only numpy: the GPU benchmark imports it on machines without the service's dependencies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties sharing the mean of their positions."""
    a = np.asarray(values, dtype=np.float64)
    order = np.argsort(a, kind="stable")
    out = np.empty(len(a))
    sorted_a = a[order]
    i = 0
    while i < len(a):
        j = i
        while j + 1 < len(a) and sorted_a[j + 1] == sorted_a[i]:
            j += 1
        out[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (Pearson on tie-averaged ranks); NaN when either side is constant."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError("spearman needs two sequences of the same length ≥ 2")
    ra, rb = ranks(a), ranks(b)
    ra -= ra.mean()
    rb -= rb.mean()
    denom = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / denom) if denom else math.nan
