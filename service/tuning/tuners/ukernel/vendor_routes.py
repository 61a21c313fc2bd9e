"""Which S of a tuned range go to the vendor library: the S where the vendor, called as the SDK calls it, is faster.

Timing both at every S is what made a dense job over M = 1..512 take minutes on two cores (issue 22
item 6). `decide` times them on a geometric grid instead and fills the S in between from the DP's
predicted cost, calibrated on the measured points, measuring only where a decision is in doubt:

  - the grid: every S ≤ 8, then 4 points per octave up to S_max. Geometric because the crossover at
    small S matters most (there the vendor's fixed cost and our per-call overhead are a large share of a
    call, and a few rows change the winner) and because both curves are smooth in log S between tile
    boundaries (where ours steps, the predicted cost steps too, and the model below sees it);
  - between neighbouring measured points whose winners differ (a crossing), the gap is bisected by
    measuring midpoints until the two are adjacent: the crossing is then exact;
  - between neighbours that agree, a cost model: our time is the predicted time scaled by the measured /
    predicted ratio at the two ends (interpolated), the vendor's time is interpolated linearly between
    its measured ends. Where that model says the other side wins by more than MODEL_MARGIN somewhere in
    the gap, that S is measured (a probe), and the process goes on from there;
  - the S still unmeasured take the winner of their gap's ends, which agree by then.

Each measured point is a set of paired rounds, and which side wins it is `route_stats`'s rule (a sign test and a
5 % margin before the uKernels keep a point; the library with the least median otherwise); with `confirm`, both
sides of every change of route are re-timed and decided on the pooled rounds (docs/routes.md).

The total number of measured points is capped (`max_points`); a crossing the cap left unresolved is
decided per S by the nearest measured point.

Where several vendor libraries were timed (numpy, PyTorch: kernelfleet.vendor), the vendor's time at S is the
fastest library's, and `fastest_libraries` says which one each vendor-routed S runs.

`vendor_sweep_shapes` (every S ≤ 256, then a stride) is the GPU tuner's grid for `decide` (gpu_routes: paired
rounds of kernel-only times plus host costs); `vendor_wins` is the older rule on one sample per S, kept for the
job-time bench's comparison and for replaying older records (`gpu_routes.replay_sweep`).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kernelfleet.dispatch import DispatchTable
from service.tuning.tuners.ukernel.route_stats import PointTiming

GRID_DENSE = 8  # every S up to here is on the grid: the small-S crossover matters most
GRID_PER_OCTAVE = 4
# The model is the DP's prediction, calibrated at two measured points; it must say the other side wins by
# more than run-to-run noise on a shared machine before a point is measured to check.
MODEL_MARGIN = 0.03
POINTS_PER_GRID_POINT = 4  # the default cap on measured points, per grid point

DECIDED_BY = ("measured", "model_probes", "between_agreeing_neighbours", "nearest_measured_at_cap")


def geometric_grid(s_max: int, dense: int = GRID_DENSE, per_octave: int = GRID_PER_OCTAVE) -> list[int]:
    """Every S ≤ `dense`, then `per_octave` points per octave up to s_max, s_max included (32 points for 512)."""
    if s_max < 1:
        raise ValueError(f"s_max must be at least 1, got {s_max}")
    shapes = set(range(1, min(dense, s_max) + 1))
    i = 1
    while (s := round(dense * 2 ** (i / per_octave))) < s_max:
        shapes.add(s)
        i += 1
    shapes.add(s_max)
    return sorted(shapes)


Measured = PointTiming | tuple[float, float]  # what `measure` returns: paired rounds, or one (ours, vendor) pair


def as_timing(measured: Measured) -> PointTiming:
    return measured if isinstance(measured, PointTiming) else PointTiming.single(*measured)


@dataclass(frozen=True)
class VendorDecision:
    vendor: frozenset[int]  # the S in 1..s_max routed to the vendor
    timed: dict[int, PointTiming]  # every S that was measured, with the rounds behind its decision
    decided_by: dict[str, int]  # how many S each rule decided (keys: DECIDED_BY); they sum to s_max
    probes: tuple[int, ...] = field(default=())  # the S measured because the model flagged them, in order
    confirmed: tuple[int, ...] = field(default=())  # the S re-timed because a route changes at them or they stand alone


def _vendor_won(t: PointTiming) -> bool:
    return t.vendor_won


def _model_doubt(lo: int, hi: int, timed: Mapping[int, PointTiming], predicted: Sequence[float]) -> tuple[float, int]:
    """The S strictly inside (lo, hi) where the calibrated model most says the ends' common winner loses,
    and by how much (other side's advantage, relative: 0.05 = the winner of the ends is 5 % slower there)."""
    ours_lo, vend_lo, ours_hi, vend_hi = timed[lo].ours_s, timed[lo].vendor_s, timed[hi].ours_s, timed[hi].vendor_s
    vendor_side = _vendor_won(timed[lo])
    ratio_lo = ours_lo / max(predicted[lo - 1], 1e-30)
    ratio_hi = ours_hi / max(predicted[hi - 1], 1e-30)
    worst, at = -math.inf, lo
    for s in range(lo + 1, hi):
        t = (s - lo) / (hi - lo)
        ours = predicted[s - 1] * (ratio_lo + t * (ratio_hi - ratio_lo))
        vendor = vend_lo + t * (vend_hi - vend_lo)
        doubt = ours / vendor - 1.0 if not vendor_side else vendor / ours - 1.0
        if doubt > worst:
            worst, at = doubt, s
    return worst, at


def _next_point(timed: Mapping[int, PointTiming], predicted: Sequence[float]) -> tuple[int, bool] | None:
    """The next S to measure and whether it is a model probe; None when every gap is settled.
    Crossings come first, widest first (with a cap, that leaves the least uncertainty behind)."""
    crossings: list[tuple[int, int]] = []
    agreeing: list[tuple[int, int]] = []
    for lo, hi in itertools.pairwise(sorted(timed)):
        if hi - lo < 2:
            continue
        if _vendor_won(timed[lo]) != _vendor_won(timed[hi]):
            crossings.append((lo, hi))
        else:
            agreeing.append((lo, hi))
    if crossings:
        lo, hi = max(crossings, key=lambda gap: (gap[1] - gap[0], -gap[0]))
        return (lo + hi) // 2, False
    best, at = MODEL_MARGIN, 0
    for lo, hi in agreeing:
        doubt, s = _model_doubt(lo, hi, timed, predicted)
        if doubt > best:
            best, at = doubt, s
    return (at, True) if at else None


def to_confirm(timed: Mapping[int, PointTiming], done: Iterable[int] = ()) -> list[int]:
    """The timed S whose decision needs more rounds: both sides of every change of route between neighbouring timed
    S (uKernel, numpy, PyTorch), and every S whose route differs from both its neighbours'; not those in `done`."""
    points = sorted(timed)
    routes = [timed[s].route for s in points]
    out: set[int] = set()
    for i in range(len(points) - 1):
        if routes[i] != routes[i + 1]:
            out |= {points[i], points[i + 1]}
    return sorted(out - set(done))


def decide(
    s_max: int,
    predicted: Sequence[float],
    measure: Callable[[int], Measured],
    must: Iterable[int] = (),
    grid: Sequence[int] | None = None,
    max_points: int | None = None,
    confirm: Callable[[int, PointTiming], PointTiming] | None = None,
) -> VendorDecision:
    """Decide for every S in 1..s_max whether the vendor is faster.

    `predicted[s - 1]` is the DP's predicted seconds of our program at S; `measure(S)` returns the rounds timed
    at S (`PointTiming`; a plain (ours, vendor) pair is one round). The grid (default `geometric_grid(s_max)`,
    with 1 and s_max added) and the `must` shapes in range are always measured; further points (bisections,
    probes) stop once `max_points` points in all are measured (default: 4 per grid point). With `confirm`
    (S, its timing → the timing with more rounds pooled), every timed S where the route changes or that stands
    alone is confirmed once before its decision stands, and the search goes on from the confirmed decisions."""
    if len(predicted) < s_max:
        raise ValueError(f"predicted covers {len(predicted)} S, the range is 1..{s_max}")
    base = geometric_grid(s_max) if grid is None else sorted({s for s in grid if 1 <= s <= s_max} | {1, s_max})
    cap = POINTS_PER_GRID_POINT * len(base) if max_points is None else max_points
    timed: dict[int, PointTiming] = {}
    for s in sorted(set(base) | {s for s in must if 1 <= s <= s_max}):
        timed[s] = as_timing(measure(s))
    probes: list[int] = []
    confirmed: list[int] = []
    while True:
        while len(timed) < cap:
            nxt = _next_point(timed, predicted)
            if nxt is None:
                break
            s, probe = nxt
            timed[s] = as_timing(measure(s))
            if probe:
                probes.append(s)
        pending = to_confirm(timed, confirmed) if confirm is not None else []
        if not pending:
            break
        assert confirm is not None
        for s in pending:
            timed[s] = confirm(s, timed[s])
        confirmed += pending

    points = sorted(timed)
    vendor: set[int] = set()
    decided_by = dict.fromkeys(DECIDED_BY, 0)
    probed = set(probes)
    for s in range(1, s_max + 1):
        if s in timed:
            won = _vendor_won(timed[s])
            decided_by["model_probes" if s in probed else "measured"] += 1
        else:
            i = bisect.bisect_left(points, s)
            lo, hi = points[i - 1], points[i]  # 1 and s_max are always measured
            if _vendor_won(timed[lo]) == _vendor_won(timed[hi]):
                won = _vendor_won(timed[lo])
                decided_by["between_agreeing_neighbours"] += 1
            else:  # only when the cap stopped the bisection: the nearest measured point (the lower on a tie)
                won = _vendor_won(timed[lo] if s - lo <= hi - s else timed[hi])
                decided_by["nearest_measured_at_cap"] += 1
        if won:
            vendor.add(s)
    return VendorDecision(frozenset(vendor), timed, decided_by, tuple(probes), tuple(confirmed))


def fastest_libraries(vendor: Iterable[int], timed: Mapping[int, Mapping[str, float]]) -> dict[int, str]:
    """Which vendor library runs each vendor-routed S: the fastest one at S where S was timed, else at the
    nearest timed S (the lower one on a tie). numpy and PyTorch cross over smoothly in S, like ours and theirs."""
    points = sorted(timed)
    if not points:
        raise ValueError("no timed S to choose vendor libraries from")
    out = {}
    for s in vendor:
        i = bisect.bisect_left(points, s)
        below, above = points[max(i - 1, 0)], points[min(i, len(points) - 1)]
        nearest = s if s in timed else (below if s - below <= above - s else above)
        libs = timed[nearest]
        out[s] = min(libs, key=lambda lib: libs[lib])
    return out


VENDOR_SWEEP_DENSE = 256  # the GPU tuner's sweep: every S up to here is timed against the vendor; beyond, a stride


def vendor_sweep_shapes(table: DispatchTable, extra: Sequence[int] = (), points: int = VENDOR_SWEEP_DENSE) -> list[int]:
    """Where the GPU tuner times the dispatcher against cuBLAS (the grid it hands `decide`): every S ≤ 256, both
    ends of every interval, the hot shapes, and a stride over the rest of the range so that no S is far from a
    measured one."""
    s_max = table.s_max
    shapes = set(range(1, min(s_max, points) + 1)) | {s for s in extra if 1 <= s <= s_max}
    for iv in table.intervals:
        shapes |= {iv.lo, iv.hi}
    if s_max > points:
        step = math.ceil(s_max / points)
        shapes |= set(range(points, s_max + 1, step))
    return sorted(shapes)


def vendor_wins(measured: Mapping[int, tuple[float, float]], s_max: int) -> set[int]:
    """Every S in 1..s_max where the vendor is faster: measured, or as measured at the nearest timed S
    (the lower one on a tie) for S the sweep skipped. The older rule, on one (ours, vendor) sample per S with no
    margin: one lucky reading decides (gpu-first-light §4 item 7); routes are now decided by `decide` on paired
    rounds."""
    timed = sorted(measured)
    out = set()
    for s in range(1, s_max + 1):
        if s in measured:
            nearest = s
        else:
            i = bisect.bisect_left(timed, s)
            below, above = timed[max(i - 1, 0)], timed[min(i, len(timed) - 1)]
            nearest = below if s - below <= above - s else above
        ours, theirs = measured[nearest]
        if theirs < ours:
            out.add(s)
    return out
