"""Which shapes of a distribution a job tunes, and how it splits its trial budget among them.

DietCode's priority: a shape matters in proportion to the work it represents in the served
traffic, FLOPs × probability. The hottest `max_shapes` shapes are tuned; trials follow priority,
with a floor so every chosen shape gets a real search.
"""

from __future__ import annotations

import math

from service.models import WorkloadSpec, normalized_support
from service.models.distribution import Explicit, Histogram, Independent, Normal, Uniform, Zipf
from service.models.plan import PlannedShape

Distribution = Explicit | Uniform | Normal | Zipf | Histogram | Independent


def hot_shapes(
    workload: WorkloadSpec, dist: Distribution, max_shapes: int
) -> list[tuple[dict[str, int], float, float]]:
    """(shape, probability, priority) for the `max_shapes` shapes with the largest FLOPs × probability."""
    scored = [(shape, w, workload.flops(shape) * w) for shape, w in normalized_support(dist)]
    scored.sort(key=lambda t: (-t[2], sorted(t[0].items())))
    return scored[:max_shapes]


def allocate(priorities: list[float], trials: int, floor: int = 8) -> list[int]:
    """Split `trials` in proportion to `priorities` (largest remainder), each share at least `floor`
    (or an equal share, when the budget is too small for the floor)."""
    n = len(priorities)
    if n == 0:
        return []
    if trials < n:
        raise ValueError(f"{trials} trials cannot cover {n} shapes")
    floor = min(floor, trials // n)
    rest = max(0, trials - floor * n)
    total = sum(priorities) or 1.0
    exact = [rest * p / total for p in priorities]
    shares = [math.floor(x) for x in exact]
    for i in sorted(range(n), key=lambda i: exact[i] - shares[i], reverse=True)[: rest - sum(shares)]:
        shares[i] += 1
    return [floor + s for s in shares]


def plan(workload: WorkloadSpec, dist: Distribution, trials: int, max_shapes: int) -> list[PlannedShape]:
    hot = hot_shapes(workload, dist, min(max_shapes, trials))
    shares = allocate([p for _, _, p in hot], trials)
    return [PlannedShape(shape=s, weight=w, priority=p, trials=t) for (s, w, p), t in zip(hot, shares, strict=True)]
