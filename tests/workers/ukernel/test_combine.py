"""Combination of uKernels along M: cost interpolation, the DP, dispatch intervals; hand-checked numbers."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from service.workers.tuners.ukernel.combine import (
    DispatchTable,
    Piece,
    TileCost,
    assign_rows,
    combine,
    intervals,
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
    assert (p50.padded_rows, p50.padding_ratio) == (52, pytest.approx(2 / 52))
    p100 = programs[99]  # 48 + 4×13 = 100 exactly: 48 + 57.2 = 105.2 beats 2×48 + 13 (110.3) and 8×13 (114.4)
    assert p100.pieces == (Piece("u48", 48, 1), Piece("u13", 52, 4))
    assert (p100.cost, p100.padding_ratio) == (pytest.approx(105.2), 0.0)
    # 101: 2×48 + 1×13 = 109 rows for 110.3 beats 48 + 5×13 (119.5) and 8×13 (114.4); the u13 piece is partial
    p101 = programs[100]
    assert p101.pieces == (Piece("u48", 96, 2), Piece("u13", 5, 1))
    assert p101.cost == pytest.approx(110.3)
    assert (p101.padded_rows, p101.padding_ratio) == (109, pytest.approx(8 / 109))


def test_per_call_overhead_merges_pieces() -> None:
    # A fixed 100-unit launch cost per piece: one padded piece always beats two exact ones.
    u48 = TileCost.from_measurements("u48", 48, {48: 148.0, 480: 580.0})
    u13 = TileCost.from_measurements("u13", 13, {13: 114.3, 130: 243.0})
    p61 = combine([u48, u13], 64)[60]
    assert len(p61.pieces) == 1


def _brute_force(costs: list[TileCost], s: int) -> float:
    """Cheapest multiset of pieces by exhaustion over tile counts per uKernel (tiny s only)."""
    best = math.inf
    ranges = [range(0, math.ceil(s / c.mt) + 1) for c in costs]
    for counts in itertools.product(*ranges):
        cap = sum(n * c.mt for n, c in zip(counts, costs, strict=True))
        if cap < s or sum(counts) == 0:
            continue
        # pieces per uKernel may be split in several; with per-tile costs one piece per uKernel is
        # enough unless splitting is cheaper, so try every split into up to 3 pieces
        for splits in itertools.product(*[_splits(n) for n in counts]):
            if sum(len(sp) for sp in splits) > s:
                continue
            total = sum(c(t * c.mt) for c, sp in zip(costs, splits, strict=True) for t in sp)
            best = min(best, total)
    return best


def _splits(n: int) -> list[tuple[int, ...]]:
    if n == 0:
        return [()]
    out = [(n,)]
    out += [(a, n - a) for a in range(1, n // 2 + 1)]
    out += [(a, b, n - a - b) for a in range(1, n) for b in range(a, n - a) if n - a - b >= b]
    return out


def test_dp_matches_brute_force_on_random_costs() -> None:
    rng = np.random.default_rng(7)
    for _ in range(5):
        costs = []
        for uid, mt in (("a", 5), ("b", 3), ("c", 1)):
            ms = {mt * t: float(rng.uniform(0.5, 2.0) * (t + rng.uniform(0, 2))) for t in (1, 2, 4)}
            costs.append(TileCost.from_measurements(uid, mt, ms))
        programs = combine(costs, 12)
        for p in programs:
            assert p.cost == pytest.approx(_brute_force(costs, p.S))
            assert sum(pc.rows for pc in p.pieces) == p.S
            assert all(1 <= pc.rows <= pc.tiles * {"a": 5, "b": 3, "c": 1}[pc.ukernel_id] for pc in p.pieces)


def test_dispatch_table_reproduces_every_program() -> None:
    programs = combine([U48, U13], 300)
    ivs = intervals(programs)
    assert ivs[0].lo == 1 and ivs[-1].hi == 300
    assert all(a.hi + 1 == b.lo and a.shape != b.shape for a, b in itertools.pairwise(ivs))
    assert len(ivs) < 300 / 3  # runs of S share a shape
    table = DispatchTable.from_programs(programs)
    again = DispatchTable.from_dict(table.to_dict())
    assert again == table
    for p in programs:
        assert table.lookup(p.S) == p.pieces == again.lookup(p.S)
    iv61 = next(iv for iv in ivs if iv.lo <= 61 <= iv.hi)
    assert iv61.shape == (("u48", 1), ("u13", 1))
    for bad in (0, 301):
        with pytest.raises(KeyError):
            table.lookup(bad)


def test_assign_rows_sheds_excess_from_the_end() -> None:
    mts = {"a": 8, "b": 3}
    assert assign_rows((("a", 2), ("b", 1)), 17, mts) == (Piece("a", 16, 2), Piece("b", 1, 1))
    assert assign_rows((("a", 2), ("b", 1)), 19, mts) == (Piece("a", 16, 2), Piece("b", 3, 1))
    assert assign_rows((("a", 2), ("b", 1)), 15, mts) == (Piece("a", 14, 2), Piece("b", 1, 1))
    with pytest.raises(ValueError):
        assign_rows((("a", 1),), 9, mts)


def test_combine_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        combine([], 10)
    with pytest.raises(ValueError):
        combine([U48, linear("u48", 8, 1.0)], 10)
