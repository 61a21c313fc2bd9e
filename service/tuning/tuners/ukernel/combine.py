"""FTuner's combination step: cover S rows with pieces, each run by one uKernel, at the least predicted cost.

A piece of r rows on a uKernel with M-tile mt computes ceil(r/mt) tiles (the last one padded), so
its cost is the uKernel's cost at that many tiles. For every S in 1..S_max a dynamic program finds
the cheapest set of pieces, at most one per uKernel, e.g. 61 = 48 + 13 on an mt=48 and an mt=13
uKernel instead of padding 61 to 96 (../shared/research/anchors.md §1). Per-uKernel costs come
from latencies measured at a few M and interpolated linearly in the number of M-tiles.

Programs are stored as data: `intervals` compresses runs of S with the same `Shape` (the same full
pieces plus a remainder piece on the same uKernel) into a dispatch table looked up with bisect;
expanding the shape at S gives back exactly the optimiser's program.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from kernelfleet.dispatch import DispatchTable, Interval, Piece, Shape, run_program
from kernelfleet.epilogue import NO_EPILOGUE, Epilogue
from kernelfleet.vendor import NUMPY

__all__ = [
    "DispatchTable",
    "Interval",
    "Piece",
    "Program",
    "Shape",
    "TileCost",
    "combine",
    "dispatch_table",
    "intervals",
    "run_program",
    "sample_ms",
]

_REL_TIE = 1e-9  # costs this close are equal; then fewer pieces, then less padding wins


@dataclass(frozen=True)
class TileCost:
    """One uKernel's latency as a function of its M-tile count, from measurements at a few M."""

    ukernel_id: str
    mt: int
    tiles: tuple[int, ...]  # strictly increasing
    seconds: tuple[float, ...]

    @classmethod
    def from_measurements(cls, ukernel_id: str, mt: int, measured: Mapping[int, float]) -> TileCost:
        """`measured` maps M to seconds; M values with the same tile count keep the fastest (least noisy) time."""
        if not measured:
            raise ValueError(f"{ukernel_id}: no measurements")
        per_tile: dict[int, float] = {}
        for m, sec in measured.items():
            if m < 1 or not sec > 0:
                raise ValueError(f"{ukernel_id}: bad measurement M={m} seconds={sec}")
            t = math.ceil(m / mt)
            per_tile[t] = min(sec, per_tile.get(t, math.inf))
        tiles = tuple(sorted(per_tile))
        return cls(ukernel_id, mt, tiles, tuple(per_tile[t] for t in tiles))

    @classmethod
    def measure(cls, ukernel_id: str, mt: int, timer: Callable[[int], float], ms: Sequence[int]) -> TileCost:
        return cls.from_measurements(ukernel_id, mt, {m: timer(m) for m in ms})

    def curve(self, max_tiles: int) -> np.ndarray:
        """Cost at 0..max_tiles tiles: piecewise linear between measured counts, the end segments
        extended beyond them, then made non-decreasing (more tiles cannot be cheaper; a dip is noise)."""
        t = np.arange(max_tiles + 1, dtype=np.float64)
        xs = np.asarray(self.tiles, dtype=np.float64)
        ys = np.asarray(self.seconds, dtype=np.float64)
        if len(xs) == 1:
            out = ys[0] * t / xs[0]
        else:
            out = np.interp(t, xs, ys)
            lo_slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
            hi_slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            if hi_slope <= 0:  # noisy tail: fall back to the average cost per tile
                hi_slope = ys[-1] / xs[-1]
            out = np.where(t < xs[0], ys[0] - lo_slope * (xs[0] - t), out)
            out = np.where(t > xs[-1], ys[-1] + hi_slope * (t - xs[-1]), out)
        curve: np.ndarray = np.maximum(out, 0.0)
        curve[0] = 0.0
        curve[1:] = np.maximum.accumulate(curve[1:])
        return curve

    def __call__(self, rows: int) -> float:
        tiles = math.ceil(rows / self.mt)
        return float(self.curve(tiles)[tiles])


def sample_ms(mt: int, s_max: int, points: int = 6) -> list[int]:
    """Where to measure a uKernel: whole tiles (no padding noise), geometrically from 1 tile to ceil(S_max/mt)."""
    top = max(1, math.ceil(s_max / mt))
    tiles = sorted({max(1, round(top ** (i / max(points - 1, 1)))) for i in range(points)} | {1, top})
    return [t * mt for t in tiles]


@dataclass(frozen=True)
class Program:
    S: int
    shape: Shape
    pieces: tuple[Piece, ...]
    cost: float
    mts: Mapping[str, int] = field(repr=False, compare=False)

    @property
    def padded_rows(self) -> int:
        return sum(p.tiles * self.mts[p.ukernel_id] for p in self.pieces)

    @property
    def padding_ratio(self) -> float:
        """Share of the computed rows that are padding: (padded − S) / padded."""
        return (self.padded_rows - self.S) / self.padded_rows


def _shape_of(tiles: Sequence[tuple[str, int]], mts: Mapping[str, int], order: Mapping[str, int]) -> Shape:
    """Canonical Shape of a multiset of (uKernel, tiles) pieces: the piece on the smallest M-tile is the
    remainder (the finest granularity absorbs what is left), the rest are full, largest M-tile first."""
    ranked = sorted(tiles, key=lambda p: (-mts[p[0]], order[p[0]], -p[1]))
    return Shape(tuple(ranked[:-1]), ranked[-1][0])


def combine(
    costs: Sequence[TileCost], s_max: int, piece_overhead_s: float = 0.0, rel_tie: float = _REL_TIE
) -> list[Program]:
    """The cheapest program for every S in 1..s_max (list index S−1), each uKernel used at most once.

    A 0/1 knapsack over the uKernels in order: best_u[S] = min(best_{u−1}[S], min over r ≤ S of
    best_{u−1}[S−r] + cost_u(r) + piece_overhead_s), vectorised over r. One piece per uKernel (as in
    FTuner's 61 = 48 + 13) bounds the calls per shape, and it keeps the optimiser from splitting one
    uKernel's rows into several calls to exploit wiggles in interpolated costs: measured, such splits
    were slower than one call. `piece_overhead_s` is the caller's cost per extra call (dispatch and
    argument marshalling), which the per-kernel timings do not include.

    Ties (costs within `rel_tie` relative; the timing noise is a good value) go to fewer pieces, then fewer
    padded rows, then earlier uKernels in `costs`, so the result is deterministic. An optimum so
    tie-broken pads less than one tile of any of its pieces (else dropping that tile is no dearer and
    pads less), so the remainder piece can absorb all the padding and the program is exactly its Shape
    expanded at S.
    """
    if not costs or s_max < 1:
        raise ValueError("need at least one uKernel and s_max ≥ 1")
    ids = [c.ukernel_id for c in costs]
    if len(set(ids)) != len(ids):
        raise ValueError("uKernel ids must be distinct")
    mts = {c.ukernel_id: c.mt for c in costs}
    order = {uid: i for i, uid in enumerate(ids)}
    curves = {c.ukernel_id: c.curve(math.ceil(s_max / c.mt)) for c in costs}
    rows = np.arange(0, s_max + 1)  # piece sizes r, with r = 0 meaning "uKernel unused"

    best = np.full(s_max + 1, np.inf)
    best[0] = 0.0
    count = np.zeros(s_max + 1, dtype=np.int64)
    padded = np.zeros(s_max + 1, dtype=np.int64)
    choice = np.zeros((len(costs), s_max + 1), dtype=np.int64)  # rows given to uKernel u at S
    for u, c in enumerate(costs):
        tiles = -(-rows // c.mt)
        piece_cost = curves[c.ukernel_id][tiles] + np.where(rows > 0, piece_overhead_s, 0.0)
        piece_pad = tiles * c.mt
        used = (rows > 0).astype(np.int64)
        new_best, new_count, new_padded = best.copy(), count.copy(), padded.copy()
        for s in range(1, s_max + 1):
            prev = slice(s, None, -1)  # layer u−1 at S − r for r = 0..s
            cand_cost = best[prev] + piece_cost[: s + 1]
            low = cand_cost.min()
            tied = np.flatnonzero(cand_cost <= low + abs(low) * rel_tie)
            cand_count = count[prev][tied] + used[tied]
            cand_pad = padded[prev][tied] + piece_pad[tied]
            r = int(tied[np.lexsort((tied, cand_pad, cand_count))[0]])
            new_best[s], new_count[s], new_padded[s] = (
                cand_cost[r],
                count[s - r] + used[r],
                padded[s - r] + piece_pad[r],
            )
            choice[u, s] = r
        best, count, padded = new_best, new_count, new_padded

    programs: list[Program] = []
    for s in range(1, s_max + 1):
        pieces_tiles: list[tuple[str, int]] = []
        rest = s
        for u in range(len(costs) - 1, -1, -1):
            r = int(choice[u, rest])
            if r:
                pieces_tiles.append((ids[u], math.ceil(r / costs[u].mt)))
                rest -= r
        shape = _shape_of(pieces_tiles, mts, order)
        pieces = shape.expand(s, mts)
        # Priced from the expanded pieces: equal to best[s] by the argument above (and never dearer,
        # since expansion can only drop whole padded tiles and costs do not fall with fewer tiles).
        cost = float(sum(curves[p.ukernel_id][p.tiles] + piece_overhead_s for p in pieces))
        programs.append(Program(S=s, shape=shape, pieces=pieces, cost=cost, mts=mts))
    return programs


VendorRoutes = Collection[int] | Mapping[int, str]  # the S routed to numpy, or S → the vendor library that runs it


def intervals(programs: Sequence[Program], vendor: VendorRoutes = ()) -> list[Interval]:
    """Runs of consecutive S whose programs have the same shape, in order of S; S in `vendor` are routed
    to a vendor library (shape None: numpy, or the library `vendor` maps S to), consecutive S on the same
    library forming one interval."""
    libraries = vendor if isinstance(vendor, Mapping) else dict.fromkeys(vendor, NUMPY)
    out: list[Interval] = []
    for p in sorted(programs, key=lambda p: p.S):
        library = libraries.get(p.S)
        iv = Interval(p.S, p.S, None, library) if library is not None else Interval(p.S, p.S, p.shape)
        last = out[-1] if out else None
        if last is not None and (last.shape, last.library) == (iv.shape, iv.library) and last.hi + 1 == p.S:
            out[-1] = replace(last, hi=p.S)
        else:
            out.append(iv)
    return out


def dispatch_table(
    programs: Sequence[Program], vendor: VendorRoutes = (), *, epilogue: Epilogue = NO_EPILOGUE
) -> DispatchTable:
    """The programs for 1..S_max as a dispatch table (runs of equal Shape compressed to intervals), with
    the S in `vendor` routed to a vendor library. `mts` names only the uKernels some interval uses;
    `epilogue` is the layer's (its uKernels fuse it, the vendor routes run it in their library)."""
    if not programs:
        raise ValueError("no programs")
    ivs = tuple(intervals(programs, vendor))
    return DispatchTable(ivs, _used_mts(ivs, programs[0].mts), epilogue)


def _used_mts(ivs: Sequence[Interval], mts: Mapping[str, int]) -> dict[str, int]:
    """The M-tiles of the uKernels some interval runs: a table names no other."""
    used = {uid for iv in ivs if iv.shape is not None for uid in (*(u for u, _ in iv.shape.fixed), iv.shape.remainder)}
    return {uid: mt for uid, mt in mts.items() if uid in used}


def overlay_routes(table: DispatchTable, routes: Sequence[tuple[int, int, str]]) -> DispatchTable:
    """The table with every S in each span [lo, hi] of `routes` sent to that span's vendor library, the other
    S kept on the table's programs. Spans may reach past the table: its last interval (whose remainder piece
    takes any extra rows) then serves the S past it that no span routes."""
    base = list(table.intervals)
    top = max([table.s_max, *(hi for _, hi, _ in routes)])
    base[-1] = replace(base[-1], hi=top)
    cuts = sorted({iv.lo for iv in base} | {lo for lo, _, _ in routes} | {hi + 1 for _, hi, _ in routes} | {top + 1})
    out: list[Interval] = []
    for lo, nxt in itertools.pairwise(cuts):
        library = next((lib for a, b, lib in routes if a <= lo <= b), None)
        if library is not None:
            seg = Interval(lo, nxt - 1, None, library)
        else:
            under = next(iv for iv in base if iv.lo <= lo <= iv.hi)
            seg = replace(under, lo=lo, hi=nxt - 1)
        last = out[-1] if out else None
        if last is not None and (last.shape, last.library) == (seg.shape, seg.library):
            out[-1] = replace(last, hi=seg.hi)
        else:
            out.append(seg)
    return DispatchTable(tuple(out), _used_mts(out, table.mts), table.epilogue)
