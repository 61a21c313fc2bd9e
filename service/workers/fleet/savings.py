"""Savings measured from the hosts' A/B holdout (issue 35 item 1): nothing here is modelled.

Per (workload, target, shape, baseline) the hosts report both sides' calls, seconds and squared seconds
(kernelfleet.holdout), so each side has a mean and a variance. The fleet's saving at a shape is its served volume
(calls that day minus the held-out ones and the misses — calls no table ran: no table, the shape past it, forwards
a PyTorch host ran as the model's own —) times the difference of the means, and the variance of that estimate is
volume² · (var_baseline/n_baseline + var_served/n_served) (Welch). Shapes are independent samples, so sums add and
so do variances: the total comes with a 95 % interval (normal approximation, ±1.96 σ). Shapes without samples on
both sides are counted as saving nothing and reported as the share of fleet time left unmeasured.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from service.models.fleet import MeasuredSaving, TaskSaving
from service.store.fleet import HoldoutSums, Usage

Z95 = 1.959964  # two-sided 95 % quantile of the normal distribution
MIN_SIDE_CALLS = 3  # samples a side needs at a shape before its mean and variance say anything


@dataclass(frozen=True)
class Side:
    """One side's timings at one shape: how many, their mean, their sample variance."""

    n: int
    mean: float
    var: float

    @staticmethod
    def of(calls: int, total: float, squares: float) -> Side | None:
        if calls < MIN_SIDE_CALLS:
            return None
        mean = total / calls
        return Side(calls, mean, max(0.0, (squares - calls * mean * mean) / (calls - 1)))

    @property
    def var_of_mean(self) -> float:
        return self.var / self.n


@dataclass(frozen=True)
class Difference:
    """Σ weight · (a − b) over shapes, its 95 % half-width, and Σ weight · a ÷ Σ weight · b."""

    delta: float
    ci95: float
    a: float
    b: float
    shapes: int

    @property
    def ratio(self) -> float | None:
        return self.a / self.b if self.b > 0 else None

    def significantly_above(self, margin: float) -> bool:
        """a exceeds b beyond the 95 % interval and by more than `margin` (relative): a decision, not a timing."""
        ratio = self.ratio
        return self.shapes > 0 and self.delta - self.ci95 > 0 and ratio is not None and ratio > 1 + margin


def difference(pairs: Iterable[tuple[float, Side, Side]]) -> Difference:
    """(weight, a, b) per shape → Σ weight·(mean_a − mean_b) with its interval."""
    delta = var = a = b = 0.0
    shapes = 0
    for weight, side_a, side_b in pairs:
        delta += weight * (side_a.mean - side_b.mean)
        var += weight * weight * (side_a.var_of_mean + side_b.var_of_mean)
        a += weight * side_a.mean
        b += weight * side_b.mean
        shapes += 1
    return Difference(delta, Z95 * math.sqrt(var), a, b, shapes)


def sides(sums: HoldoutSums) -> tuple[Side, Side] | None:
    """(served, baseline) at one shape, or None when either side has too few samples."""
    served = Side.of(sums.served_calls, sums.served_s, sums.served_s2)
    base = Side.of(sums.baseline_calls, sums.baseline_s, sums.baseline_s2)
    return None if served is None or base is None else (served, base)


def measure(
    usage: Iterable[Usage],
    holdout: Iterable[HoldoutSums],
    since: dt.date,
    until: dt.date,
    days: int,
    labels: Mapping[str, str] | None = None,
) -> MeasuredSaving:
    """The fleet's saving per day over [since, until] (`days` of them observed): per task and in total, each with
    its 95 % interval. `usage` gives the volume (calls per shape), `holdout` both sides' sums (all tables together)."""
    days = max(1, days)
    volume: dict[tuple[str, str, str], Usage] = {}
    fleet_s = 0.0
    for u in usage:
        volume[(u.workload_hash, u.target_fingerprint, u.shape_key)] = u
        fleet_s += u.kernel_seconds
    rows = list(holdout)
    # hosts with different baselines at one shape are separate samples: each gets the share of the shape's
    # volume its hosts' sampled calls make up
    sampled: dict[tuple[str, str, str], int] = {}
    for h in rows:
        key = (h.workload_hash, h.target_fingerprint, h.shape_key)
        sampled[key] = sampled.get(key, 0) + h.served_calls + h.baseline_calls
    by_task: dict[tuple[str, str], list[tuple[float, Side, Side]]] = {}
    measured_s = 0.0
    held_calls = served_calls = 0
    for h in rows:
        held_calls += h.baseline_calls
        pair = sides(h)
        key = (h.workload_hash, h.target_fingerprint, h.shape_key)
        used = volume.get(key)
        if pair is None or used is None or used.calls <= 0:
            continue
        share = (h.served_calls + h.baseline_calls) / sampled[key]
        # held-out calls saved nothing, and neither did misses (the kernel seconds are not split: scaled alike)
        share *= 1.0 - min(used.fallbacks, used.calls) / used.calls
        served_here = max(0, round(used.calls * share) - h.baseline_calls)
        served_calls += served_here
        served, base = pair
        by_task.setdefault((h.workload_hash, h.target_fingerprint), []).append((served_here / days, base, served))
        measured_s += used.kernel_seconds * share
    tasks = []
    for (wh, fp), pairs in by_task.items():
        d = difference(pairs)  # baseline − served: the saving
        tasks.append(TaskSaving(workload_hash=wh, target_fingerprint=fp, label=(labels or {}).get(wh, ""),
                                shapes=d.shapes, baseline_s_per_day=d.a, served_s_per_day=d.b,
                                saved_s_per_day=d.delta, ci95_s_per_day=d.ci95))  # fmt: skip
    tasks.sort(key=lambda t: -t.saved_s_per_day)
    total = difference(p for pairs in by_task.values() for p in pairs)
    return MeasuredSaving(
        since=since,
        until=until,
        days=days,
        fleet_s_per_day=fleet_s / days,
        measured_share=min(1.0, measured_s / fleet_s) if fleet_s > 0 else 0.0,
        served_calls=served_calls,
        holdout_calls=held_calls,
        saved_s_per_day=total.delta,
        ci95_s_per_day=total.ci95,
        speedup=total.ratio,
        tasks=tasks,
    )
