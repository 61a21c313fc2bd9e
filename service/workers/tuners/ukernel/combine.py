"""FTuner's combination step: cover S rows with pieces, each run by one uKernel, at the least predicted cost.

A piece of r rows on a uKernel with M-tile mt computes ceil(r/mt) tiles (the last one padded), so
its cost is the uKernel's cost at that many tiles. For every S in 1..S_max a dynamic program over S
finds the cheapest multiset of pieces, e.g. 61 = 48 + 13 on an mt=48 and an mt=13 uKernel instead
of padding 61 to 96 (../shared/research/anchors.md §1). Per-uKernel costs come from latencies
measured at a few M and interpolated linearly in the number of M-tiles.

Programs are stored as data: `intervals` compresses runs of S that use the same pieces (same
uKernels, same tile counts) into a dispatch table looked up with bisect; the rows of each piece are
then a fixed function of S (`assign_rows`), so the table reproduces every program exactly.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

_REL_TIE = 1e-9  # costs this close are equal; then fewer pieces, then less padding wins

Shape = tuple[tuple[str, int], ...]  # ((ukernel_id, tiles), ...) in canonical order


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
class Piece:
    ukernel_id: str
    rows: int
    tiles: int


@dataclass(frozen=True)
class Program:
    S: int
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

    @property
    def shape(self) -> Shape:
        return tuple((p.ukernel_id, p.tiles) for p in self.pieces)


def assign_rows(shape: Shape, S: int, mts: Mapping[str, int]) -> tuple[Piece, ...]:
    """Rows per piece for S: every piece full except the excess, shed from the last pieces first.

    Any split with the same tile counts costs the same, so this fixed rule is what makes a dispatch
    interval (one shape, many S) reproduce the optimiser's program for every S in it.
    """
    caps = [tiles * mts[uid] for uid, tiles in shape]
    excess = sum(caps) - S
    if excess < 0 or len(shape) > S:
        raise ValueError(f"shape {shape} cannot hold S={S}")
    rows = list(caps)
    for i in range(len(rows) - 1, -1, -1):
        shed = min(excess, rows[i] - 1)  # each piece keeps at least one row
        rows[i] -= shed
        excess -= shed
    return tuple(Piece(uid, r, tiles) for (uid, tiles), r in zip(shape, rows, strict=True))


def combine(costs: Sequence[TileCost], s_max: int) -> list[Program]:
    """The cheapest program for every S in 1..s_max (list index S−1).

    best[S] = min over uKernels u and piece sizes r ≤ S of best[S−r] + cost_u(r), vectorised over r.
    Ties (within 1e-9 relative) go to fewer pieces, then fewer padded rows, then the earlier uKernel
    in `costs`, so the result is deterministic.
    """
    if not costs or s_max < 1:
        raise ValueError("need at least one uKernel and s_max ≥ 1")
    ids = [c.ukernel_id for c in costs]
    if len(set(ids)) != len(ids):
        raise ValueError("uKernel ids must be distinct")
    mts = {c.ukernel_id: c.mt for c in costs}
    rows = np.arange(1, s_max + 1)
    piece_tiles = [np.ceil(rows / c.mt).astype(np.int64) for c in costs]
    piece_cost = [c.curve(int(t[-1]))[t] for c, t in zip(costs, piece_tiles, strict=True)]  # index r−1
    piece_pad = [t * c.mt for c, t in zip(costs, piece_tiles, strict=True)]

    best = np.zeros(s_max + 1)
    count = np.zeros(s_max + 1, dtype=np.int64)
    padded = np.zeros(s_max + 1, dtype=np.int64)
    choice = np.zeros((s_max + 1, 2), dtype=np.int64)  # (uKernel index, r)
    for s in range(1, s_max + 1):
        prev = slice(s - 1, None, -1)  # best[s−r] for r = 1..s
        cand_cost = np.concatenate([best[prev] + pc[:s] for pc in piece_cost])
        cand_count = np.tile(count[prev] + 1, len(costs))
        cand_pad = np.concatenate([padded[prev] + pp[:s] for pp in piece_pad])
        low = cand_cost.min()
        tied = np.flatnonzero(cand_cost <= low + abs(low) * _REL_TIE)
        pick = tied[np.lexsort((tied, cand_pad[tied], cand_count[tied]))[0]]
        u, r = divmod(int(pick), s)
        best[s], count[s], padded[s] = cand_cost[pick], cand_count[pick], cand_pad[pick]
        choice[s] = (u, r + 1)

    programs: list[Program] = []
    order = {uid: i for i, uid in enumerate(ids)}
    for s in range(1, s_max + 1):
        tiles: dict[str, list[int]] = {}
        rest = s
        while rest:
            u, r = (int(v) for v in choice[rest])
            tiles.setdefault(ids[u], []).append(math.ceil(r / costs[u].mt))
            rest -= r
        shape: Shape = tuple(
            (uid, t) for uid in sorted(tiles, key=order.__getitem__) for t in sorted(tiles[uid], reverse=True)
        )
        programs.append(Program(S=s, pieces=assign_rows(shape, s, mts), cost=float(best[s]), mts=mts))
    return programs


@dataclass(frozen=True)
class Interval:
    lo: int
    hi: int
    shape: Shape


def intervals(programs: Sequence[Program]) -> list[Interval]:
    """Runs of consecutive S whose programs have the same shape, in order of S."""
    out: list[Interval] = []
    for p in sorted(programs, key=lambda p: p.S):
        if out and out[-1].shape == p.shape and out[-1].hi + 1 == p.S:
            out[-1] = Interval(out[-1].lo, p.S, p.shape)
        else:
            out.append(Interval(p.S, p.S, p.shape))
    return out


@dataclass(frozen=True)
class DispatchTable:
    """Shape → program lookup, stored as plain data (FTuner's inst_id_disp_map, compressed to intervals)."""

    intervals: tuple[Interval, ...]
    mts: Mapping[str, int]

    @classmethod
    def from_programs(cls, programs: Sequence[Program]) -> DispatchTable:
        if not programs:
            raise ValueError("no programs")
        return cls(tuple(intervals(programs)), dict(programs[0].mts))

    def lookup(self, S: int) -> tuple[Piece, ...]:
        i = bisect.bisect_right([iv.lo for iv in self.intervals], S) - 1
        if i < 0 or self.intervals[i].hi < S:
            raise KeyError(f"S={S} is outside the table ({self.intervals[0].lo}..{self.intervals[-1].hi})")
        return assign_rows(self.intervals[i].shape, S, self.mts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mts": dict(self.mts),
            "intervals": [[iv.lo, iv.hi, [[uid, t] for uid, t in iv.shape]] for iv in self.intervals],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DispatchTable:
        ivs = tuple(
            Interval(int(lo), int(hi), tuple((str(u), int(t)) for u, t in sh)) for lo, hi, sh in data["intervals"]
        )
        return cls(ivs, {str(k): int(v) for k, v in data["mts"].items()})


class RowKernel(Protocol):
    """What `run_program` needs from a uKernel (kernel.UKernel satisfies it)."""

    def __call__(self, x: np.ndarray, packed_w: np.ndarray, out: np.ndarray | None = None) -> np.ndarray: ...


def run_program(
    pieces: Sequence[Piece],
    kernels: Mapping[str, RowKernel],
    packed: Mapping[str, np.ndarray],
    x: np.ndarray,
    out: np.ndarray,
) -> np.ndarray:
    """Run each piece on its rows of X, writing the matching rows of `out` in place."""
    start = 0
    for p in pieces:
        kernels[p.ukernel_id](x[start : start + p.rows], packed[p.ukernel_id], out[start : start + p.rows])
        start += p.rows
    if start != x.shape[0]:
        raise ValueError(f"pieces cover {start} rows, X has {x.shape[0]}")
    return out
