"""Per-shape programs over uKernels, as plain data: which uKernel runs which rows of X for a given S.

A program for S rows is a few pieces, each run by one shape-generic uKernel on its own rows, e.g.
61 = 48 + 13 rows on an mt=48 and an mt=13 uKernel (FTuner's combination). Consecutive S whose
programs have the same `Shape` (the same full pieces plus a remainder piece on the same uKernel)
form one interval, so a dispatch table covering 1..S_max is a short sorted list looked up with
bisect. The service computes the table (service/tuning/tuners/ukernel/combine.py); inference
hosts only read it.

An interval may instead route its S to a vendor library (numpy or PyTorch: kernelfleet.vendor): the job
measured them all as the SDK calls them and that library was the fastest there. On the wire such an
interval is `[lo, hi, "vendor"]` (numpy) or `[lo, hi, "vendor:torch"]`, and its program is empty (no
piece: the dispatcher calls the library).

A table for a layer with an epilogue (bias, activation: kernelfleet.epilogue) carries it: its uKernels
compute it in their store, and S routed to a vendor run it in that library. On the wire it is an `epilogue`
entry, present only when there is one, so tables from before epilogues read (and verify) as they were.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from kernelfleet.epilogue import NO_EPILOGUE, Epilogue
from kernelfleet.vendor import NUMPY, VENDOR, library_of, route_of

__all__ = ["VENDOR", "DispatchTable", "Interval", "Piece", "Shape", "run_program"]


@dataclass(frozen=True)
class Piece:
    ukernel_id: str
    rows: int
    tiles: int


@dataclass(frozen=True)
class Shape:
    """A program as a function of S: full pieces of fixed tile counts, then one remainder piece on
    `remainder` that takes the rows left, S − Σ fixed rows, padded up to its M-tile.

    Consecutive S whose optimal programs share a Shape form one dispatch interval: e.g. 53..61 as
    48 + (S−48) on an mt=13 uKernel, or all of 1..S_max on one uKernel when a single piece wins.
    """

    fixed: tuple[tuple[str, int], ...]  # (ukernel_id, tiles), largest M-tile first
    remainder: str

    def fixed_rows(self, mts: Mapping[str, int]) -> int:
        return sum(tiles * mts[uid] for uid, tiles in self.fixed)

    def expand(self, S: int, mts: Mapping[str, int]) -> tuple[Piece, ...]:
        rest = S - self.fixed_rows(mts)
        if rest < 1:
            raise ValueError(f"{self} needs S > {self.fixed_rows(mts)}, got {S}")
        full = tuple(Piece(uid, tiles * mts[uid], tiles) for uid, tiles in self.fixed)
        return (*full, Piece(self.remainder, rest, math.ceil(rest / mts[self.remainder])))

    def to_list(self) -> list[Any]:
        return [[[uid, tiles] for uid, tiles in self.fixed], self.remainder]

    @classmethod
    def from_list(cls, data: Sequence[Any]) -> Shape:
        return cls(tuple((str(uid), int(tiles)) for uid, tiles in data[0]), str(data[1]))


@dataclass(frozen=True)
class Interval:
    lo: int
    hi: int
    shape: Shape | None  # None: the vendor library `library` runs these S
    library: str = NUMPY  # only for a vendor interval

    @property
    def vendor(self) -> bool:
        return self.shape is None

    def to_list(self) -> list[Any]:
        return [self.lo, self.hi, route_of(self.library) if self.shape is None else self.shape.to_list()]

    @classmethod
    def from_list(cls, data: Sequence[Any]) -> Interval:
        lo, hi, shape = data
        if isinstance(shape, str):
            library = library_of(shape)
            if library is None:
                raise ValueError(f"unknown interval kind {shape!r}; this SDK knows programs and vendor routes")
            return cls(int(lo), int(hi), None, library)
        return cls(int(lo), int(hi), Shape.from_list(shape))


@dataclass(frozen=True)
class DispatchTable:
    """S → program lookup, stored as plain data (FTuner's inst_id_disp_map, compressed to intervals)."""

    intervals: tuple[Interval, ...]
    mts: Mapping[str, int]
    epilogue: Epilogue = NO_EPILOGUE  # what every S computes after X·Wᵀ: the uKernels' and the vendor's

    @property
    def s_max(self) -> int:
        return self.intervals[-1].hi

    def lookup(self, S: int) -> tuple[Piece, ...]:
        """The program for S rows; empty where the table routes S to the vendor library. Beyond the
        tuned range the last interval extends: its remainder piece is shape-generic, so it takes every
        extra row (padded to its M-tile), and a last vendor interval keeps larger S on the vendor."""
        shape = self.interval(S).shape
        return () if shape is None else shape.expand(S, self.mts)

    def interval(self, S: int) -> Interval:
        """The interval that serves S (the last one for every S past the table)."""
        if self.intervals[0].lo > S:
            raise KeyError(f"S={S} is below the table ({self.intervals[0].lo}..{self.s_max})")
        i = bisect.bisect_right(self._starts, S) - 1
        if self.intervals[i].hi < S and i != len(self.intervals) - 1:
            raise KeyError(f"S={S} falls in a gap of the table")
        return self.intervals[i]

    def vendor_at(self, S: int) -> bool:
        """Whether the table routes S to a vendor library."""
        return self.interval(S).vendor

    def vendor_library(self, S: int) -> str | None:
        """The vendor library the table routes S to, or None when uKernels run S."""
        iv = self.interval(S)
        return iv.library if iv.vendor else None

    def nearest_shape(self, S: int) -> Shape | None:
        """The uKernel program shape of the interval nearest S that can run S rows (its own where uKernels run S),
        None where no interval can: what a caller that checks uKernels at a vendor-routed S in place runs there
        (kernelfleet.torch). Its remainder piece is shape-generic, so it runs S however far the interval ends."""
        runnable = (iv for iv in self.intervals if iv.shape is not None and iv.shape.fixed_rows(self.mts) < S)
        nearest = min(runnable, key=lambda iv: (max(iv.lo - S, S - iv.hi, 0), iv.lo), default=None)
        return nearest.shape if nearest is not None else None

    @functools.cached_property
    def _starts(self) -> list[int]:
        return [iv.lo for iv in self.intervals]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mts": dict(self.mts), "intervals": [iv.to_list() for iv in self.intervals]}
        if self.epilogue != NO_EPILOGUE:
            out["epilogue"] = self.epilogue.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DispatchTable:
        ivs = tuple(Interval.from_list(iv) for iv in data["intervals"])
        return cls(ivs, {str(k): int(v) for k, v in data["mts"].items()}, Epilogue.from_dict(data.get("epilogue")))


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
