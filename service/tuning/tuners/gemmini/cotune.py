"""Co-tuning with the reporting backend in the loop (issue 36 item 3: one objective).

The model searches, the backend decides, in two rounds:
1. co-exploration on BACO's analytical model as published (half the model-call budget); the backend measures
   its shortlist (backend_pick.py);
2. the model is calibrated to the backend (calibration.py) on a fresh sample of each layer family and dataflow
   plus round 1's measured answers, i.e. where the search goes: fitted on random configs alone, the calibration
   was wrong exactly there, and a search on it alone led a BERT FFN to a shortlist ZigZag measured at 0.64x the
   default; co-exploration then runs on the calibrated model with the rest of the budget, and the backend
   measures its shortlist too.
The winner is the lowest measured EDP among both shortlists and the search's start as gemmini.h tiles it (the
default, where the limits allow it), so it is never one the backend measures worse than what one has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.tuning.gemmini.space import DEFAULT_HW, HwConfig, Layer, Mapping
from service.tuning.tuners.gemmini.backend_pick import SHORTLIST, Measured, measure_options, measure_shortlist, ranked
from service.tuning.tuners.gemmini.best_flow import default_options, flow_options
from service.tuning.tuners.gemmini.calibration import CALIBRATION_POINTS, Calibration, calibrate
from service.tuning.tuners.gemmini.search import Limits, SearchResult, co_explore


class CountingBackend:
    """Counts the points (one layer on one config in one dataflow) a backend is asked to measure."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.points = inner, 0

    def measure(self, hw: HwConfig, layers: list[Layer], mappings: list[Mapping]) -> list[Any]:
        self.points += len(layers)
        return list(self.inner.measure(hw, layers, mappings))

    def measure_points(self, points: list[tuple[HwConfig, Layer, Mapping]]) -> list[Any]:
        self.points += len(points)
        return list(self.inner.measure_points(points))

    def version(self) -> str:
        return str(self.inner.version())


@dataclass(frozen=True)
class Cotuned:
    winner: Measured
    candidates: list[Measured]  # everything the backend measured as a whole network, best first
    start: Measured  # the search's start as gemmini.h tiles it (the default, unless the limits exclude it)
    first: SearchResult  # round 1, on the model as published (its explored configs: model numbers)
    second: SearchResult  # round 2, on the calibrated model
    calibration: Calibration
    model_calls: int
    evaluations: int  # backend points: the calibration sample, both shortlists, the start


def cotune(
    backend: Any,
    layers: list[Layer],
    budget: int,
    seed: int = 0,
    limits: Limits = Limits(),
    start_hw: HwConfig = DEFAULT_HW,
    shortlist: int = SHORTLIST,
    per_family: int = CALIBRATION_POINTS,
) -> Cotuned:
    """Both rounds within `budget` model calls; raises RuntimeError where no point is valid and ValueError
    where the backend can measure none of the candidates."""
    counted = CountingBackend(backend)
    first = co_explore(layers, max(1, budget // 2), seed=seed, start_hw=start_hw, limits=limits)
    answers = measure_shortlist(counted, layers, first.shortlist(layers, shortlist, (start_hw,)))
    known = [
        ((m.hw, lay, mp), r) for m in answers for lay, mp, r in zip(layers, m.mappings, m.measurements, strict=True)
    ]
    calibration, _ = calibrate(counted, layers, seed, limits, per_family, known)
    second = co_explore(
        layers, max(1, budget - first.calls), seed=seed, start_hw=start_hw, limits=limits, cost=calibration.cost
    )
    seen = {m.hw for m in answers}
    fresh = [(hw, flow_options(hw, layers, maps)) for hw, maps in second.shortlist(layers, shortlist) if hw not in seen]
    # round 2's new configs and the start as gemmini.h tiles it, in one backend run; a round-2 config whose tiles
    # fit no dataflow the backend runs is dropped (round 1's answers stand)
    *more, start = measure_options(counted, layers, [*fresh, (start_hw, default_options(start_hw, layers))])
    if isinstance(start, str):
        raise ValueError(start)
    candidates = ranked(layers, [*answers, *(m for m in more if not isinstance(m, str)), start])
    return Cotuned(
        candidates[0],
        candidates,
        start,
        first,
        second,
        calibration,
        first.calls + second.calls,
        counted.points,
    )
