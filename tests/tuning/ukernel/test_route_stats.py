"""Route decisions on paired, repeated samples (issue 31 item 1): one bad sample cannot move a route.

Pure Python: synthetic rounds, each test knows the right answer and injects the outliers that used to decide.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from service.tuning.tuners.ukernel.route_stats import CONFIRM_ROUNDS, MIN_ROUNDS, UKERNEL, PointTiming
from service.tuning.tuners.ukernel.vendor_routes import decide, fastest_libraries, to_confirm


def _rounds(ours: float, numpy: float, torch: float, n: int, noise: float = 0.02, seed: int = 0) -> PointTiming:
    rng = random.Random(seed)

    def jitter(v: float) -> tuple[float, ...]:
        return tuple(v * (1 + rng.uniform(-noise, noise)) for _ in range(n))

    return PointTiming(jitter(ours), {"numpy": jitter(numpy), "torch": jitter(torch)})


def test_a_ukernel_keeps_a_shape_only_when_the_sign_test_and_the_margin_say_so() -> None:
    win = _rounds(0.85, 1.0, 1.2, CONFIRM_ROUNDS)
    assert win.ukernel_wins and win.route == UKERNEL and win.library == "numpy"
    assert not _rounds(0.85, 1.0, 1.2, MIN_ROUNDS).ukernel_wins  # too few rounds for the sign test
    assert _rounds(0.85, 1.0, 1.2, MIN_ROUNDS).needs_more_rounds
    assert not _rounds(0.97, 1.0, 1.2, CONFIRM_ROUNDS, noise=0.0).ukernel_wins  # 3 % faster: within the margin
    one_lost = PointTiming((0.8, 0.8, 0.8, 0.8, 1.3), {"numpy": (1.0,) * 5})
    assert not one_lost.ukernel_wins and one_lost.route == "numpy" and one_lost.needs_more_rounds  # 4 of 5: p = 0.19
    assert one_lost.merged(PointTiming((0.8,) * 3, {"numpy": (1.0,) * 3})).ukernel_wins  # 7 of 8: p = 0.035
    two_lost = one_lost.merged(PointTiming((0.8, 1.2, 0.8), {"numpy": (1.0,) * 3}))  # 6 of 8: p = 0.14
    assert not two_lost.ukernel_wins and not two_lost.needs_more_rounds and two_lost.route == "numpy"
    assert not PointTiming((1.2, 0.8, 1.2), {"numpy": (1.0,) * 3}).needs_more_rounds  # a clear loss: no more rounds


def test_one_outlier_round_cannot_choose_the_library() -> None:
    # PyTorch is faster in every round but one, where numpy reads 3× faster (the M=431 reading of issue 31)
    t = PointTiming((2.0, 2.0, 2.0), {"numpy": (1.6, 0.47, 1.64), "torch": (1.3, 1.35, 1.32)})
    assert t.library == "torch" and t.route == "torch"
    assert t.to_dict()["samples_s"] == {
        UKERNEL: [2.0, 2.0, 2.0],
        "numpy": [1.6, 0.47, 1.64],
        "torch": [1.3, 1.35, 1.32],
    }


def test_one_fast_round_of_ours_cannot_win_a_shape() -> None:
    t = PointTiming((0.3, 1.2, 1.25, 1.2, 1.22), {"numpy": (1.0,) * 5})
    assert not t.ukernel_wins and t.route == "numpy"


def test_pooled_rounds_and_their_checks() -> None:
    a = _rounds(0.8, 1.0, 1.1, 3)
    assert a.merged(_rounds(0.8, 1.0, 1.1, 2, seed=1)).rounds == 5
    with pytest.raises(ValueError):
        a.merged(PointTiming((1.0,), {"numpy": (1.0,)}))
    with pytest.raises(ValueError):
        PointTiming((1.0, 1.0), {"numpy": (1.0,)})


Curve = Callable[[int], tuple[float, float, float]]  # S → true (ours, numpy, torch) seconds


def _timer(
    curve: Curve, outliers: dict[int, Callable[[PointTiming], PointTiming]], seed: int = 0
) -> Callable[..., PointTiming]:
    """A measure function: MIN_ROUNDS noisy rounds around the curve, the injected outlier in the first round of the
    first timing of the S it names, then more rounds while the sequential rule asks for them."""
    calls: dict[int, int] = {}

    def measure(S: int) -> PointTiming:
        calls[S] = calls.get(S, 0) + 1
        t = _rounds(*curve(S), MIN_ROUNDS, seed=seed * 100_003 + S * 7 + calls[S])
        if calls[S] == 1 and S in outliers:
            t = outliers[S](t)
        while t.needs_more_rounds:  # sequential, as the tuner's time_point
            t = t.merged(_rounds(*curve(S), max(1, CONFIRM_ROUNDS - t.rounds), seed=seed + S * 13 + t.rounds))
        return t

    return measure


def _curve(S: int) -> tuple[float, float, float]:
    """Ours wins by 20 % from S = 100 on; PyTorch is the faster library everywhere (by 15 %)."""
    vendor = 1e-6 * (5 + S)
    return (vendor * (0.8 if S >= 100 else 1.3)), vendor * 1.15, vendor


def _decide(outliers: dict[int, Callable[[PointTiming], PointTiming]]) -> tuple[frozenset[int], dict[int, str]]:
    measure = _timer(_curve, outliers)
    got = decide(256, [1e-6 * (5 + S) for S in range(1, 257)], measure, confirm=lambda S, t: t.merged(measure(S)))
    routes = fastest_libraries(got.vendor, {S: {t.library: t.vendor_s} for S, t in got.timed.items()})
    return got.vendor, routes


def _fast_round(side: str, factor: float) -> Callable[[PointTiming], PointTiming]:
    """One round of `side` reads `factor`× its time (a burst of load, or a lucky quiet moment)."""

    def inject(t: PointTiming) -> PointTiming:
        if side == UKERNEL:
            return PointTiming((t.ours[0] * factor, *t.ours[1:]), t.libraries)
        libs = dict(t.libraries)
        libs[side] = (libs[side][0] * factor, *libs[side][1:])
        return PointTiming(t.ours, libs)

    return inject


def test_the_clean_curve_routes_below_the_crossing_to_the_faster_library() -> None:
    vendor, routes = _decide({})
    assert vendor == frozenset(range(1, 100)) and set(routes.values()) == {"torch"}


@pytest.mark.parametrize(
    "outliers",
    [
        {64: _fast_round("numpy", 0.3)},  # numpy reads 3× faster once: used to send its span to numpy
        {64: _fast_round(UKERNEL, 0.3)},  # ours reads 3× faster once below the crossing
        {128: _fast_round(UKERNEL, 3.0)},  # ours reads 3× slower once above it
        {99: _fast_round(UKERNEL, 0.3), 100: _fast_round(UKERNEL, 3.0)},  # both sides of the boundary
        {128: _fast_round("torch", 0.2)},  # the library reads 5× faster once where ours wins
    ],
)
def test_one_bad_sample_moves_no_boundary_and_flips_no_route(
    outliers: dict[int, Callable[[PointTiming], PointTiming]],
) -> None:
    assert _decide(outliers) == _decide({})


def test_every_change_of_route_between_timed_neighbours_is_confirmed() -> None:
    timed = {
        1: PointTiming.single(2.0, 1.0, "numpy"),
        2: PointTiming.single(2.0, 1.0, "torch"),  # the library changes here
        3: PointTiming.single(2.0, 1.0, "torch"),
        4: PointTiming.single(0.5, 1.0, "torch"),  # the uKernel wins here
        5: PointTiming.single(0.5, 1.0, "torch"),
    }
    assert to_confirm(timed) == [1, 2, 3, 4] and to_confirm(timed, done=[1, 2]) == [3, 4]
    asked: list[int] = []

    def confirm(S: int, t: PointTiming) -> PointTiming:
        asked.append(S)
        return t

    decide(5, [1.0] * 5, lambda S: timed[S], confirm=confirm)
    assert sorted(asked) == [1, 2, 3, 4]
