"""Searches that spend backend evaluations directly, with no model: the baselines of issue 36 item 4.

Co-exploration spends thousands of analytical-model calls and then a few dozen backend evaluations (the
calibration sample and the shortlist). The fair question is whether those evaluations would have done better
spent on the backend directly. An evaluation is one layer on one config in one dataflow (one ZigZag point); a
sample any layer of which fits no dataflow is dropped before it costs one. Both return the lowest network EDP
the backend measured and the points it spent.
- `backend_random`: uniform legal hardware within the limits (search.random_hw) with uniform tiles
  (search.random_mapping), each layer in a dataflow its array runs it with: BACO's random baseline.
- `backend_grid`: the full hardware grid (search.hw_grid: every legal capacity, the default's included), evenly
  strided when the evaluations cannot cover it (the offset set by the seed), gemmini.h's own tiling on each point.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.tuning.gemmini.gemmini_h import default_mapping
from service.tuning.gemmini.model import resolve
from service.tuning.gemmini.space import HwConfig, Layer, Mapping, fit
from service.tuning.tuners.gemmini.backend_pick import network_edp
from service.tuning.tuners.gemmini.search import Limits, hw_grid, random_hw, random_mapping, strided

MAX_DRAWS = 200  # random draws per wanted sample before giving up (tiny budgets, awkward layers)


@dataclass(frozen=True)
class BackendBest:
    hw: HwConfig
    mappings: list[Mapping]
    edp: float  # the backend's network EDP (BACO Eq. 6.9 on its measurements)
    evaluations: int  # backend points spent


def _best(backend: Any, layers: Sequence[Layer], samples: list[tuple[HwConfig, list[Mapping]]]) -> BackendBest:
    if not samples:
        raise RuntimeError("no sample fits the layers within the evaluations")
    points = [(hw, lay, m) for hw, maps in samples for lay, m in zip(layers, maps, strict=True)]
    results = backend.measure_points(points)
    best: BackendBest | None = None
    for k, (hw, maps) in enumerate(samples):
        edp = network_edp(layers, results[k * len(layers) : (k + 1) * len(layers)])
        if edp is not None and (best is None or edp < best.edp):
            best = BackendBest(hw, maps, edp, len(points))
    if best is None:
        raise RuntimeError(f"{backend.version()} gives no energy: no EDP to compare")
    return best


def backend_random(
    backend: Any, layers: list[Layer], evaluations: int, seed: int = 0, limits: Limits = Limits()
) -> BackendBest:
    rng = random.Random(seed)
    samples: list[tuple[HwConfig, list[Mapping]]] = []
    draws = 0
    while (len(samples) + 1) * len(layers) <= evaluations and draws < MAX_DRAWS * (len(samples) + 1):
        draws += 1
        hw = random_hw(rng, limits)
        maps = []
        for lay in layers:
            m = random_mapping(hw, lay, rng).with_flow(rng.choice(hw.flows(lay) or ("WS",)))
            if fit(hw, lay, m) is not None:
                break
            maps.append(m)
        else:
            samples.append((hw, maps))
    return _best(backend, layers, samples)


def backend_grid(
    backend: Any, layers: list[Layer], evaluations: int, seed: int = 0, limits: Limits = Limits()
) -> BackendBest:
    fitting = []  # the grid points that hold every layer with gemmini.h's tiling: the stride spends none elsewhere
    for hw in hw_grid(limits):
        maps = [resolve(hw, lay, default_mapping(hw, lay)) for lay in layers]
        if all(fit(hw, lay, m) is None for lay, m in zip(layers, maps, strict=True)):
            fitting.append((hw, maps))
    return _best(backend, layers, strided(fitting, evaluations // len(layers), random.Random(seed).random()))
