"""Combination of uKernels along M: cost interpolation, the DP, dispatch intervals; hand-checked numbers."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from service.tuning.tuners.ukernel.combine import (
    DispatchTable,
    Interval,
    Piece,
    Shape,
    TileCost,
    combine,
    dispatch_table,
    intervals,
    overlay_routes,
    sample_ms,
)


def linear(uid: str, mt: int, per_row: float) -> TileCost:
    """Cost proportional to computed (padded) rows: per_row·mt per tile."""
    return TileCost.from_measurements(uid, mt, {mt: per_row * mt, 10 * mt: per_row * 10 * mt})


# u48 costs 1 per computed row, u13 costs 1.1: big tiles are cheaper per row, small ones pad less.
U48, U13 = linear("u48", 48, 1.0), linear("u13", 13, 1.1)


def test_tile_cost_interpolates_per_tile() -> None:
    c = TileCost.from_measurements("u", 4, {4: 1.0, 16: 2.5})  # 1 tile → 1.0, 4 tiles → 2.5
    assert c.tiles == (1, 4)
    assert [c(r) for r in (1, 4, 5, 8, 12, 16)] == pytest.approx([1.0, 1.0, 1.5, 1.5, 2.0, 2.5])
    assert c(24) == pytest.approx(3.5)  # 6 tiles: last slope 0.5/tile extended
    assert c.curve(6) == pytest.approx([0.0, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5])


def test_tile_cost_noise_handling() -> None:
    dip = TileCost.from_measurements("u", 1, {1: 1.0, 2: 0.8, 3: 1.5})
    assert dip.curve(3) == pytest.approx([0.0, 1.0, 1.0, 1.5])  # more tiles never cheaper
    same_tile = TileCost.from_measurements("u", 8, {5: 2.0, 8: 1.0, 16: 3.0})  # M=5 and 8 are both 1 tile
    assert same_tile.tiles == (1, 2) and same_tile.seconds == (1.0, 3.0)
    single = TileCost.from_measurements("u", 8, {16: 3.0})
    assert single.curve(3) == pytest.approx([0.0, 1.5, 3.0, 4.5])  # proportional to tiles
    falling_tail = TileCost.from_measurements("u", 1, {1: 1.0, 2: 2.0, 3: 1.8})
    # the falling last segment is noise: extend with the average per tile (1.8/3 = 0.6) instead
    assert falling_tail.curve(4) == pytest.approx([0.0, 1.0, 2.0, 2.0, 2.4])
    with pytest.raises(ValueError):
        TileCost.from_measurements("u", 8, {})
    with pytest.raises(ValueError):
        TileCost.from_measurements("u", 8, {8: 0.0})


def test_sample_ms_are_whole_tiles_from_one_to_the_top() -> None:
    assert sample_ms(6, 128, points=4) == [6, 18, 48, 132]  # tiles 22^(i/3) rounded: 1, 3 (2.80), 8 (7.85), 22
    ms = sample_ms(8, 64)
    assert ms[0] == 8 and ms[-1] == 64 and all(m % 8 == 0 for m in ms) and ms == sorted(set(ms))


def test_61_is_48_plus_13() -> None:
    programs = combine([U48, U13], 128)
    p61 = programs[60]
    assert p61.S == 61
    assert p61.pieces == (Piece("u48", 48, 1), Piece("u13", 13, 1))
    assert p61.cost == pytest.approx(48 + 14.3)  # vs 96 for 2×48 and 71.5 for 5×13
    assert (p61.padded_rows, p61.padding_ratio) == (61, 0.0)


def test_multiples_of_mt_use_one_piece() -> None:
    programs = combine([U48, U13], 128)
    assert programs[47].pieces == (Piece("u48", 48, 1),)
    assert programs[95].pieces == (Piece("u48", 96, 2),)
    assert programs[25].pieces == (Piece("u13", 26, 2),)  # 28.6 < 48 (one padded u48 tile)
    assert programs[38].pieces == (Piece("u13", 39, 3),)  # 42.9 < 48


def test_padding_ratio_and_partial_pieces() -> None:
    programs = combine([U48, U13], 128)
    p50 = programs[49]  # 4×13 = 52 rows cost 57.2, beats 48+13 (62.3) and 96
    assert p50.pieces == (Piece("u13", 50, 4),)
    assert p50.padded_rows == 52
    assert p50.padding_ratio == pytest.approx(2 / 52)
    p100 = programs[99]  # 48 + 4×13 = 100 exactly: 48 + 57.2 = 105.2 beats 2×48 + 13 (110.3) and 8×13 (114.4)
    assert p100.pieces == (Piece("u48", 48, 1), Piece("u13", 52, 4))
    assert p100.cost == pytest.approx(105.2)
    assert p100.padding_ratio == 0.0
    # 101: 2×48 + 1×13 = 109 rows for 110.3 beats 48 + 5×13 (119.5) and 8×13 (114.4); the u13 piece is partial
    p101 = programs[100]
    assert p101.pieces == (Piece("u48", 96, 2), Piece("u13", 5, 1))
    assert p101.cost == pytest.approx(110.3)
    assert p101.padded_rows == 109
    assert p101.padding_ratio == pytest.approx(8 / 109)


def test_per_call_overhead_merges_pieces() -> None:
    # 20 units per call: 48 + 13 costs 62.3 + 40 = 102.3, one padded 5×13 piece 71.5 + 20 = 91.5.
    p61 = combine([U48, U13], 64, piece_overhead_s=20.0)[60]
    assert p61.pieces == (Piece("u13", 61, 5),)
    assert p61.cost == pytest.approx(91.5)


def test_one_piece_per_ukernel_even_when_splitting_looks_cheaper() -> None:
    # Concave cost (a cheap first tile): 2×(1 tile) = 2.0 would beat 1×(2 tiles) = 3.0 if splits were allowed.
    concave = TileCost.from_measurements("u", 4, {4: 1.0, 8: 3.0, 16: 5.0})
    p8 = combine([concave], 8)[7]
    assert p8.pieces == (Piece("u", 8, 2),)
    assert p8.cost == pytest.approx(3.0)


def _brute_force(costs: list[TileCost], s: int, overhead: float = 0.0) -> float:
    """Cheapest program by exhaustion: every tile count (0 = unused) for every uKernel (tiny s only)."""
    best = math.inf
    for counts in itertools.product(*[range(math.ceil(s / c.mt) + 1) for c in costs]):
        if sum(n * c.mt for n, c in zip(counts, costs, strict=True)) >= s and any(counts):
            best = min(best, sum(c(n * c.mt) + overhead for n, c in zip(counts, costs, strict=True) if n))
    return best


def test_dp_matches_brute_force_on_random_costs() -> None:
    rng = np.random.default_rng(7)
    for _ in range(6):
        costs = []
        for uid, mt in (("a", 5), ("b", 3), ("c", 1)):
            ms = {mt * t: float(rng.uniform(0.5, 2.0) * (t + rng.uniform(0, 2))) for t in (1, 2, 4)}
            costs.append(TileCost.from_measurements(uid, mt, ms))
        programs = combine(costs, 14, piece_overhead_s=0.1)
        for p in programs:
            assert p.cost == pytest.approx(_brute_force(costs, p.S, overhead=0.1))
            assert len({pc.ukernel_id for pc in p.pieces}) == len(p.pieces)
            assert sum(pc.rows for pc in p.pieces) == p.S
            assert all(1 <= pc.rows <= pc.tiles * {"a": 5, "b": 3, "c": 1}[pc.ukernel_id] for pc in p.pieces)


def test_dispatch_table_reproduces_every_program() -> None:
    programs = combine([U48, U13], 300)
    ivs = intervals(programs)
    assert ivs[0].lo == 1 and ivs[-1].hi == 300
    assert all(a.hi + 1 == b.lo and a.shape != b.shape for a, b in itertools.pairwise(ivs))
    assert len(ivs) < 300 / 3  # runs of S share a shape
    table = dispatch_table(programs)
    again = DispatchTable.from_dict(table.to_dict())
    assert again == table
    for p in programs:
        assert table.lookup(p.S) == p.pieces == again.lookup(p.S)
    iv61 = next(iv for iv in ivs if iv.lo <= 61 <= iv.hi)
    assert iv61.shape == Shape((("u48", 1),), "u13")
    # 52 = 4×13 exactly (57.2 < 62.3 for 48 + 13); 62 is cheapest as 5×13 (71.5 < 76.6 for 48 + 2×13)
    assert (iv61.lo, iv61.hi) == (53, 61)
    with pytest.raises(KeyError):
        table.lookup(0)
    # beyond the tuned range the last shape extends: its remainder uKernel takes the extra rows
    last = ivs[-1].shape
    for s in (301, 389, 1000):
        pieces = table.lookup(s)
        assert pieces == last.expand(s, table.mts) and sum(p.rows for p in pieces) == s


def test_shape_expands_to_full_pieces_plus_a_remainder() -> None:
    mts = {"a": 8, "b": 3}
    shape = Shape((("a", 2),), "b")
    assert shape.expand(17, mts) == (Piece("a", 16, 2), Piece("b", 1, 1))
    assert shape.expand(19, mts) == (Piece("a", 16, 2), Piece("b", 3, 1))
    assert shape.expand(23, mts) == (Piece("a", 16, 2), Piece("b", 7, 3))
    assert Shape((), "a").expand(5, mts) == (Piece("a", 5, 1),)
    assert Shape.from_list(shape.to_list()) == shape
    with pytest.raises(ValueError):
        shape.expand(16, mts)


def test_one_ukernel_is_one_interval() -> None:
    programs = combine([linear("u6", 6, 1.0)], 100)
    assert intervals(programs) == [Interval(1, 100, Shape((), "u6"))]
    assert programs[12].pieces == (Piece("u6", 13, 3),)
    assert programs[12].padding_ratio == pytest.approx(5 / 18)


def test_combine_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        combine([], 10)
    with pytest.raises(ValueError):
        combine([U48, linear("u48", 8, 1.0)], 10)


def test_overlaid_routes_replace_their_spans_and_keep_every_other_program() -> None:
    programs = combine([U48, U13], 300)
    table = dispatch_table(programs)
    routes = [(1, 10, "torch"), (100, 120, "numpy"), (121, 140, "numpy"), (900, 1200, "torch")]
    routed = overlay_routes(table, routes)
    assert all(a.hi + 1 == b.lo for a, b in itertools.pairwise(routed.intervals)) and routed.intervals[0].lo == 1
    assert Interval(100, 140, None, "numpy") in routed.intervals  # adjacent spans on one library merge
    assert routed.intervals[-1] == Interval(900, 1200, None, "torch")  # a span past the table: it extends from there
    for S in (*range(1, 400), 899, 900, 1200, 5000):
        span = next((lib for lo, hi, lib in routes if lo <= S <= hi), None)
        if S > 1200:
            span = "torch"  # the last interval extends
        if span is not None:
            assert routed.vendor_library(S) == span and routed.lookup(S) == ()
        else:  # the table's own program, past its end its extended last interval
            assert routed.lookup(S) == table.lookup(S) and sum(p.rows for p in routed.lookup(S)) == S
    assert DispatchTable.from_dict(routed.to_dict()) == routed
    everything = overlay_routes(table, [(1, 300, "torch")])
    assert everything.intervals == (Interval(1, 300, None, "torch"),) and everything.mts == {}
    assert overlay_routes(table, []) == table
