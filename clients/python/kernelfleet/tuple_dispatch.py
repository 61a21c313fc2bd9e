"""A dispatch table over several dynamic dims: any tuple in the tuned box → a uKernel id or the vendor, O(d log n).

Each symbolic dim d has sorted class starts s_d[0] < s_d[1] < … and a box end hi_d; class c of dim d is [s_d[c],
s_d[c+1] − 1] (the last one ends at hi_d). A cell is one class per dim (the product of per-dim intervals), stored
row-major in `cells`: a uKernel id, a vendor route ("vendor": numpy, "vendor:torch": PyTorch, measured faster
there) or None (a hole: no tuple of the distribution fell in the cell, so nothing was measured or verified there).
`lookup` is one `bisect` per dim, O(d log n) for n classes per dim.

Why a grid and not DietCode's decision tree: DietCode's tree splits on one dim at a time against a
threshold (axis-aligned), so the leaves it can express are boxes; the product grid of every dim's split
points refines all of them, so it expresses any such tree exactly, and the lookup is a bisect per dim
instead of a root-to-leaf walk (both O(log n) per dim for a balanced tree). The grid is also easy to
verify: every cell is one (class, class, …) tuple the tuner measured at, the wire form is a flat list
whose length must equal the product of the class counts, and holes and the box's ends are explicit. Its
cost, a cell per class combination, stays small here: classes are geometric (about 10 per dim up to 512)
and jobs have at most 3 symbolic dims.

A tuple outside the box (below the first start or above hi in any dim) or in a hole has no entry:
`lookup` returns None and the dispatcher runs numpy, counted as a miss.

Routes per layout: which library is fastest depends on how the caller holds its operands (batch_matmul's Bt
contiguous, or the transposed view of a contiguous [B,K,N], as attention's A·V passes V), so a table may carry
`layouts`: a layout's own cells over the same grid, for callers in that layout. A layout it does not name (every
layout, in tables from before routes were chosen per layout) reads `cells`. On the wire `layouts` is left out when
empty, so such tables keep their exact form.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.vendor import is_vendor, library_of

FORMAT = "tuple-table-v1"


def geometric_starts(lo: int, hi: int) -> list[int]:
    """Class starts for lo..hi: every power of two plus one (1, 2, 3, 5, 9, 17, …), clipped to the range,
    so a class [2^k + 1, 2^(k+1)] pads to the same tile counts within a factor of 2."""
    starts = [lo]
    edge = 1
    while edge < hi:
        if edge + 1 > lo:
            starts.append(edge + 1)
        edge *= 2
    return sorted(set(starts))


@dataclass(frozen=True)
class TupleDispatchTable:
    dims: tuple[str, ...]
    starts: tuple[tuple[int, ...], ...]  # per dim, sorted class starts; starts[d][0] is the box's low end
    his: tuple[int, ...]  # per dim, the box's high end
    cells: tuple[str | None, ...]  # row-major over the class grid
    # a layout's own cells, where they differ from `cells` (not hashed: a dict; equal tables still hash equal)
    layouts: Mapping[str, tuple[str | None, ...]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not self.dims or len(set(self.dims)) != len(self.dims):
            raise ValueError(f"dims must be distinct and non-empty: {self.dims}")
        if len(self.starts) != len(self.dims) or len(self.his) != len(self.dims):
            raise ValueError("one list of class starts and one box end per dim")
        for d, s, hi in zip(self.dims, self.starts, self.his, strict=True):
            if not s or s[0] < 1 or any(a >= b for a, b in itertools.pairwise(s)) or hi < s[-1]:
                raise ValueError(f"dim {d}: starts must increase from ≥ 1 and end ≤ hi={hi}, got {s}")
        size = math.prod(len(s) for s in self.starts)
        for name, cells in {"": self.cells, **self.layouts}.items():
            if len(cells) != size:
                where = f" of layout {name}" if name else ""
                raise ValueError(f"{len(cells)} cells{where} for a {'×'.join(str(len(s)) for s in self.starts)} grid")
            if name and [c is None for c in cells] != [c is None for c in self.cells]:
                raise ValueError(f"layout {name} has other holes than the table: a hole is a class never measured")
        for cell in self.routes():
            library_of(cell)  # an unknown vendor route is refused here, not on the call that meets it

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(s) for s in self.starts)

    @functools.cached_property
    def _strides(self) -> tuple[int, ...]:
        out, acc = [], 1
        for n in reversed(self.shape):
            out.append(acc)
            acc *= n
        return tuple(reversed(out))

    def class_of(self, values: Sequence[int]) -> tuple[int, ...] | None:
        """Each value's class index, or None when the tuple is outside the box."""
        out = []
        for v, s, hi in zip(values, self.starts, self.his, strict=True):
            if v < s[0] or v > hi:
                return None
            out.append(bisect.bisect_right(s, v) - 1)
        return tuple(out)

    def cell_index(self, classes: Sequence[int]) -> int:
        return sum(c * st for c, st in zip(classes, self._strides, strict=True))

    def cells_of(self, layout: str | None = None) -> tuple[str | None, ...]:
        """The cells a caller in `layout` runs: that layout's own, or `cells` (no layout, or one not named)."""
        return self.cells if layout is None else self.layouts.get(layout, self.cells)

    def lookup(self, values: Sequence[int], layout: str | None = None) -> str | None:
        """The uKernel id or vendor route for this tuple (in `dims` order) in `layout`; None outside the box or in
        a hole."""
        index = 0
        for v, (starts, lo, hi, stride) in zip(values, self._axes, strict=False):
            if v < lo or v > hi:
                return None
            index += (bisect.bisect_right(starts, v) - 1) * stride
        return self.cells_of(layout)[index]

    @functools.cached_property
    def _axes(self) -> tuple[tuple[tuple[int, ...], int, int, int], ...]:
        return tuple((s, s[0], hi, st) for s, hi, st in zip(self.starts, self.his, self._strides, strict=True))

    def lookup_shape(self, shape: Mapping[str, int], layout: str | None = None) -> str | None:
        return self.lookup([shape[d] for d in self.dims], layout)

    def class_bounds(self, classes: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """The (lo, hi) of each dim's class: the cell's box."""
        out = []
        for c, s, hi in zip(classes, self.starts, self.his, strict=True):
            out.append((s[c], s[c + 1] - 1 if c + 1 < len(s) else hi))
        return tuple(out)

    def grid(self) -> Iterator[tuple[int, ...]]:
        """Every cell's class tuple, in `cells` order."""
        yield from itertools.product(*(range(n) for n in self.shape))

    def routes(self) -> set[str]:
        """Every uKernel id and vendor route some cell of some layout names."""
        return {c for cells in (self.cells, *self.layouts.values()) for c in cells if c is not None}

    def ukernel_ids(self) -> set[str]:
        return {c for c in self.routes() if not is_vendor(c)}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": FORMAT,
            "dims": list(self.dims),
            "starts": [list(s) for s in self.starts],
            "his": list(self.his),
            "cells": list(self.cells),
        }
        if self.layouts:
            out["layouts"] = {name: list(cells) for name, cells in sorted(self.layouts.items())}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TupleDispatchTable:
        if data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} table: format {data.get('format')!r}")
        return cls(
            dims=tuple(str(d) for d in data["dims"]),
            starts=tuple(tuple(int(v) for v in s) for s in data["starts"]),
            his=tuple(int(h) for h in data["his"]),
            cells=_cells(data["cells"]),
            layouts={str(name): _cells(cells) for name, cells in data.get("layouts", {}).items()},
        )


def _cells(wire: Sequence[Any]) -> tuple[str | None, ...]:
    return tuple(None if c is None else str(c) for c in wire)
