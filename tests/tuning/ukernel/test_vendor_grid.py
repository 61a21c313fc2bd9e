"""The vendor decision from a geometric grid, bisected crossings and the calibrated cost model (issue 22 item 6).

Pure Python: `measure` is a synthetic (ours, vendor) curve, so each test knows the exact answer.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import pytest

from service.tuning.tuners.ukernel.vendor_routes import DECIDED_BY, MODEL_MARGIN, decide, geometric_grid

Curve = Callable[[int], tuple[float, float]]


class Recorder:
    """A measure function that remembers what it was asked, and fails on a second call at the same S."""

    def __init__(self, curve: Curve, s_max: int) -> None:
        self.curve, self.s_max = curve, s_max
        self.calls: list[int] = []

    def __call__(self, S: int) -> tuple[float, float]:
        assert 1 <= S <= self.s_max and S not in self.calls, S
        self.calls.append(S)
        return self.curve(S)


def _ours(S: float) -> float:
    return 3e-6 + 2e-8 * S  # a fixed per-call cost plus the rows


def _single_crossover(c: float) -> Curve:
    """The vendor wins below c and loses above: no fixed cost, a steeper slope."""
    slope = _ours(c) / c
    return lambda S: (_ours(S), slope * S)


def test_the_grid_is_every_small_s_then_four_points_per_octave() -> None:
    grid = geometric_grid(512)
    assert len(grid) == 32 and grid[:8] == list(range(1, 9)) and grid[-1] == 512
    for lo in (8, 16, 32, 64, 128, 256):
        assert len([s for s in grid if lo < s <= 2 * lo]) == 4, lo
    assert geometric_grid(5) == [1, 2, 3, 4, 5]
    assert geometric_grid(48)[-2:] == [45, 48] and geometric_grid(1) == [1]
    with pytest.raises(ValueError):
        geometric_grid(0)


@pytest.mark.parametrize("c", [2.5, 9.5, 36.5, 200.5, 499.5])
def test_a_single_crossover_is_found_exactly(c: float) -> None:
    s_max = 512
    measure = Recorder(_single_crossover(c), s_max)
    predicted = [0.8 * _ours(S) for S in range(1, s_max + 1)]  # off by a constant factor: calibration fixes it
    got = decide(s_max, predicted, measure)
    assert got.vendor == frozenset(range(1, int(c) + 1))
    assert int(c) in got.timed and int(c) + 1 in got.timed  # measured on both sides of the crossing
    assert got.probes == () and len(measure.calls) <= len(geometric_grid(s_max)) + 7  # log2 of the widest gap
    assert got.decided_by["measured"] == len(got.timed)
    assert sum(got.decided_by.values()) == s_max


def test_two_crossings_are_both_found_exactly() -> None:
    s_max = 512
    inside = range(100, 141)  # the vendor wins here only (a tile boundary of ours, say)
    measure = Recorder(lambda S: (_ours(S), _ours(S) * (0.9 if S in inside else 1.1)), s_max)
    got = decide(s_max, [_ours(S) for S in range(1, s_max + 1)], measure)
    assert got.vendor == frozenset(inside)
    assert {99, 100, 140, 141} <= set(got.timed) and got.decided_by["nearest_measured_at_cap"] == 0


def test_no_crossing_measures_only_the_grid_and_the_must_shapes() -> None:
    s_max = 512
    measure = Recorder(lambda S: (_ours(S), 1.5 * _ours(S) + 1e-6), s_max)
    got = decide(s_max, [_ours(S) for S in range(1, s_max + 1)], measure, must=[300, 77, 9999])
    assert set(measure.calls) == set(got.timed) == set(geometric_grid(s_max)) | {300, 77}
    assert got.vendor == frozenset() and got.probes == ()
    assert got.decided_by["between_agreeing_neighbours"] == s_max - len(got.timed)
    everything_vendor = decide(s_max, [_ours(S) for S in range(1, s_max + 1)], lambda S: (2 * _ours(S), _ours(S)))
    assert everything_vendor.vendor == frozenset(range(1, s_max + 1)) and len(everything_vendor.timed) == 32


def _bump(S: int) -> float:
    return 1.3 if 40 <= S <= 43 else 1.0  # our program pads there: 30 % more work


def test_a_vendor_win_between_agreeing_grid_points_is_probed_when_the_model_predicts_it() -> None:
    s_max = 512
    grid = geometric_grid(s_max)
    assert 38 in grid and 45 in grid and not any(39 <= s <= 44 for s in grid)  # both neighbours: ours wins
    base = [1e-6 * (2 + S) for S in range(1, s_max + 1)]
    predicted = [b * _bump(S) for S, b in enumerate(base, 1)]

    def curve(S: int) -> tuple[float, float]:
        return 1.1 * predicted[S - 1], 1.25 * base[S - 1]  # vendor/ours: 1.14 outside 40..43, 0.87 inside

    got = decide(s_max, predicted, Recorder(curve, s_max))
    assert got.vendor == frozenset(range(40, 44))
    assert got.probes and all(39 <= s <= 44 for s in got.probes) and got.decided_by["model_probes"] == len(got.probes)
    # the same curves with a prediction that does not see the bump: the grid's neighbours agree, nothing is probed
    flat = decide(s_max, base, Recorder(curve, s_max))
    assert flat.vendor == frozenset() and flat.probes == ()


def test_a_probe_that_confirms_the_winner_settles_the_gap() -> None:
    s_max = 512
    base = [1e-6 * (2 + S) for S in range(1, s_max + 1)]
    predicted = [b * _bump(S) for S, b in enumerate(base, 1)]  # predicts a bump the measurements do not show
    got = decide(s_max, predicted, Recorder(lambda S: (base[S - 1], 1.25 * base[S - 1]), s_max))
    assert got.vendor == frozenset() and 1 <= len(got.probes) <= 4  # after the probes the model agrees again


def test_a_small_doubt_within_the_margin_is_not_probed() -> None:
    s_max = 128
    base = [1e-6 * (2 + S) for S in range(1, s_max + 1)]
    almost = 1 + MODEL_MARGIN * 0.5
    predicted = [b * (almost * 1.1 if 40 <= S <= 43 else 1.0) for S, b in enumerate(base, 1)]
    got = decide(s_max, predicted, Recorder(lambda S: (base[S - 1], 1.1 * base[S - 1]), s_max))
    assert got.probes == () and set(got.timed) == set(geometric_grid(s_max))


def test_max_points_is_respected_and_the_rest_goes_by_the_nearest_measured_point() -> None:
    s_max = 512
    rng = random.Random(7)
    coin = {S: rng.random() < 0.5 for S in range(1, s_max + 1)}  # noise: the winner flips at random
    measure = Recorder(lambda S: (1.0, 0.9 if coin[S] else 1.1), s_max)
    cap = len(geometric_grid(s_max)) + 10
    got = decide(s_max, [1.0] * s_max, measure, max_points=cap)
    assert len(got.timed) == len(measure.calls) == cap
    assert got.decided_by["nearest_measured_at_cap"] > 0 and sum(got.decided_by.values()) == s_max
    assert all((S in got.vendor) == coin[S] for S in got.timed)
    default = decide(s_max, [1.0] * s_max, Recorder(measure.curve, s_max))  # default cap: 4 per grid point
    assert cap < len(default.timed) <= 4 * len(geometric_grid(s_max))


@pytest.mark.parametrize("s_max", [1, 2, 8, 9, 100, 333, 512])
def test_every_s_is_decided_once(s_max: int) -> None:
    rng = random.Random(s_max)
    coin = {S: rng.random() < 0.3 for S in range(1, s_max + 1)}
    measure = Recorder(lambda S: (1.0, 0.5 if coin[S] else 2.0), s_max)
    got = decide(s_max, [1.0] * s_max, measure, must=[s_max, 1, 0, s_max + 1])
    assert set(got.decided_by) == set(DECIDED_BY) and sum(got.decided_by.values()) == s_max
    assert got.vendor <= frozenset(range(1, s_max + 1)) and {1, s_max} <= set(got.timed)
    points = sorted(got.timed)
    if got.decided_by["nearest_measured_at_cap"] == 0:  # every crossing between measured S was bisected
        for lo, hi in itertools.pairwise(points):
            assert (lo in got.vendor) == (hi in got.vendor) or hi == lo + 1
            assert all((S in got.vendor) == (lo in got.vendor) for S in range(lo, hi))


def test_predicted_must_cover_the_range() -> None:
    with pytest.raises(ValueError, match="predicted"):
        decide(10, [1.0] * 9, lambda S: (1.0, 1.0))
