"""The multi-dim dispatch table: classes per dim, cells, holes, the box's ends, the wire form (no TVM needed)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelfleet.dispatch import VENDOR
from kernelfleet.tuple_dispatch import TupleDispatchTable, geometric_starts

TABLE = TupleDispatchTable(
    dims=("M", "N"),
    starts=((1, 2, 3, 5), (4, 9)),
    his=(8, 64),
    cells=("a", VENDOR, None, "b", "a", "a", "b", None),  # row-major: M class, then N class
)


def test_geometric_starts() -> None:
    assert geometric_starts(1, 512) == [1, 2, 3, 5, 9, 17, 33, 65, 129, 257]
    assert geometric_starts(3, 100) == [3, 5, 9, 17, 33, 65]
    assert geometric_starts(7, 7) == [7]


def test_boundaries_holes_and_the_box() -> None:
    assert TABLE.lookup([1, 4]) == "a" and TABLE.lookup([1, 8]) == "a" and TABLE.lookup([1, 9]) == VENDOR
    assert TABLE.lookup([2, 4]) is None  # a hole
    assert TABLE.lookup([3, 64]) == "a" and TABLE.lookup([4, 9]) == "a"
    assert TABLE.lookup([5, 4]) == "b" and TABLE.lookup([8, 8]) == "b" and TABLE.lookup([8, 9]) is None
    for outside in ([0, 4], [9, 4], [1, 3], [1, 65], [100, 100]):
        assert TABLE.lookup(outside) is None
    assert TABLE.lookup_shape({"B": 12, "M": 5, "N": 10, "K": 64}) is None
    assert TABLE.class_bounds((3, 0)) == ((5, 8), (4, 8))
    assert TABLE.ukernel_ids() == {"a", "b"}


def test_wire_round_trip_and_malformed_tables() -> None:
    assert TupleDispatchTable.from_dict(TABLE.to_dict()) == TABLE
    bad = TABLE.to_dict()
    with pytest.raises(ValueError, match="cells"):
        TupleDispatchTable.from_dict({**bad, "cells": bad["cells"][:-1]})
    with pytest.raises(ValueError, match="starts"):
        TupleDispatchTable.from_dict({**bad, "starts": [[1, 3, 2, 5], [4, 9]]})
    with pytest.raises(ValueError, match="format"):
        TupleDispatchTable.from_dict({**bad, "format": "other"})


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 40), min_size=1, max_size=6, unique=True),
    st.lists(st.integers(1, 40), min_size=1, max_size=6, unique=True),
    st.integers(0, 10),
    st.integers(0, 10),
    st.integers(0, 45),
    st.integers(0, 55),
)
def test_lookup_matches_a_brute_force_scan(sm: list[int], sn: list[int], em: int, en: int, m: int, n: int) -> None:
    starts = (tuple(sorted(sm)), tuple(sorted(sn)))
    his = (starts[0][-1] + em, starts[1][-1] + en)
    cells = tuple(f"u{i}" for i in range(len(starts[0]) * len(starts[1])))
    table = TupleDispatchTable(("M", "N"), starts, his, cells)
    want = None
    for (i, (lo_m, hi_m)), (j, (lo_n, hi_n)) in itertools.product(
        enumerate(_intervals(starts[0], his[0])), enumerate(_intervals(starts[1], his[1]))
    ):
        if lo_m <= m <= hi_m and lo_n <= n <= hi_n:
            want = cells[i * len(starts[1]) + j]
    assert table.lookup([m, n]) == want


def _intervals(starts: tuple[int, ...], hi: int) -> list[tuple[int, int]]:
    return [(s, (starts[i + 1] - 1) if i + 1 < len(starts) else hi) for i, s in enumerate(starts)]


def test_routes_per_layout_on_the_wire_and_tables_from_before() -> None:
    """A layout's own cells travel under "layouts"; a table without them (as every table was before routes were
    chosen per layout) keeps its exact wire form and runs `cells` in every layout."""
    assert "layouts" not in TABLE.to_dict() and TABLE.layouts == {}
    for layout in (None, "BNK", "BKN"):
        assert TABLE.lookup([1, 9], layout) == VENDOR and TABLE.cells_of(layout) == TABLE.cells
    bkn = ("vendor:torch", "c", None, "b", VENDOR, "a", "b", None)
    per_layout = TupleDispatchTable(TABLE.dims, TABLE.starts, TABLE.his, TABLE.cells, {"BKN": bkn})
    wire = per_layout.to_dict()
    assert wire["cells"] == list(TABLE.cells) and wire["layouts"] == {"BKN": list(bkn)}
    assert TupleDispatchTable.from_dict(wire) == per_layout and per_layout != TABLE
    assert per_layout.lookup([1, 4], "BKN") == "vendor:torch" and per_layout.lookup([1, 4], "BNK") == "a"
    assert per_layout.lookup([1, 9], "BKN") == "c" and per_layout.lookup([2, 4], "BKN") is None
    assert per_layout.ukernel_ids() == {"a", "b", "c"}
    assert hash(per_layout) == hash(TupleDispatchTable.from_dict(wire))  # still hashable, as before
    with pytest.raises(ValueError, match="layout BKN"):
        TupleDispatchTable.from_dict({**wire, "layouts": {"BKN": bkn[:-1]}})
    with pytest.raises(ValueError, match="holes"):
        TupleDispatchTable.from_dict({**wire, "layouts": {"BKN": [*bkn[:2], "a", *bkn[3:]]}})  # a cell in a hole
    with pytest.raises(ValueError, match="unknown vendor route"):
        TupleDispatchTable.from_dict({**wire, "layouts": {"BKN": ["vendor:mkl", *bkn[1:]]}})
