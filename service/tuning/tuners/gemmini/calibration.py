"""Calibration of the analytical model against a measuring backend (thesis §6.6.5 reports r = 0.85).

Every measurement keeps its backend's name; `correlate` reports Pearson's r on cycles (and on log-cycles,
which is what ranks candidates across shapes of very different size), Spearman's rank correlation, and a
least-squares fit measured ≈ a·model + b that a tuner can apply as a correction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def _pearson(x: Sequence[float], y: Sequence[float]) -> float:
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sx = math.sqrt(sum((a - mx) ** 2 for a in x))
    sy = math.sqrt(sum((b - my) ** 2 for b in y))
    return sxy / (sx * sy) if sx > 0 and sy > 0 else float("nan")


def _ranks(v: Sequence[float]) -> list[float]:
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0.0] * len(v)
    for rank, i in enumerate(order):
        r[i] = float(rank)
    return r


def correlate(model: Sequence[float], measured: Sequence[float], backend: str) -> dict[str, Any]:
    if len(model) != len(measured) or len(model) < 3:
        return {"backend": backend, "n": len(model), "note": "need at least 3 paired points"}
    n = len(model)
    mx, my = sum(model) / n, sum(measured) / n
    var = sum((a - mx) ** 2 for a in model)
    a = sum((p - mx) * (q - my) for p, q in zip(model, measured, strict=True)) / var if var else float("nan")
    return {
        "backend": backend,
        "n": n,
        "pearson_r": _pearson(model, measured),
        "pearson_r_log": _pearson([math.log(v) for v in model], [math.log(v) for v in measured]),
        "spearman_rho": _pearson(_ranks(model), _ranks(measured)),
        "fit": {"a": a, "b": my - a * mx},
    }
