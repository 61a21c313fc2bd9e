"""FAKE Gemmini backends for tests that need a backend whose answers are known: both price each point with the
analytical model (no simulator runs). ZigZag itself runs in the calibration, best-flow and kind tests."""

from __future__ import annotations

from service.tuning.gemmini.backends.base import Backend, Measurement
from service.tuning.gemmini.model import energy_terms, flow_cost, layer_cost
from service.tuning.gemmini.space import HwConfig, Layer, Mapping, fit

TRUE_ENERGY = {"mac": 1.0, "register": 0.5, "accumulator": 2.0, "scratchpad": 0.3, "dram": 1.5}


class SkewedModelBackend:
    """FAKE backend: the analytical model with DRAM and accumulator energy weighted differently and cycles
    bent (1.2 · cycles^1.05), i.e. a known disagreement a calibration should undo."""

    def __init__(self) -> None:
        self.calls = 0

    def version(self) -> str:
        return "fake-skewed-model"

    def measure_points(self, points: list[tuple[HwConfig, Layer, Mapping]]) -> list[Measurement]:
        self.calls += 1
        out = []
        for hw, lay, m in points:
            c = flow_cost(hw, lay, m, m.flow or "WS")
            terms = energy_terms(hw, c)
            energy = sum(TRUE_ENERGY[t] * terms[t] for t in terms)
            out.append(Measurement(self.version(), lay.name, 1.2 * c.cycles**1.05, energy))
        return out


class ModelBackend(Backend):
    """FAKE: the analytical model as a backend; records each `measure` call's config and point count."""

    name = "fake-model"

    def __init__(self) -> None:
        self.calls: list[tuple[HwConfig, int]] = []

    def measure(self, hw: HwConfig, layers: list[Layer], mappings: list[Mapping]) -> list[Measurement]:
        self.calls.append((hw, len(layers)))
        out = []
        for lay, m in zip(layers, mappings, strict=True):
            assert m.flow is not None and fit(hw, lay, m) is None  # only runnable points are ever measured
            c = layer_cost(hw, lay, m)
            out.append(Measurement(self.name, lay.name, c.cycles, c.energy_pj))
        return out
