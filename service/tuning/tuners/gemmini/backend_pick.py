"""The winner is the backend's pick, not the model's (issue 36 item 3: one objective).

The search ranks hardware by BACO's analytical model, which disagrees with the backend that reports the result
(QKV: model 3.45x, ZigZag 4.90x; a 1x1 conv 5.1x vs 1.70x), so its single best point can be one the backend
measures worse than a runner-up, or even worse than the default. Here the model shortlists: the `k` explored
hardware configs of lowest model EDP, each with the mappings the search found for it, are measured by the
backend (each layer in its fastest dataflow, best_flow.py) and the lowest measured network EDP wins. The model
still does the searching (thousands of calls); the backend decides between its few best answers. The search's
start (the default hardware, with the mappings the search found for it) is always among them, and the default as
gemmini.h tiles it joins them where it is measured (`ranked`): where the backend measures none of the model's
favourites better, the answer is what one has, not a worse one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.tuning.gemmini.model import network_cost
from service.tuning.gemmini.space import HwConfig, Layer, Mapping
from service.tuning.tuners.gemmini.best_flow import flow_options, measured_best_each

SHORTLIST = 4  # configs a search round hands the backend; each costs a point per layer and dataflow it runs


@dataclass(frozen=True)
class Measured:
    """One shortlisted config as the model priced it and the backend measured it (each layer's fastest flow)."""

    hw: HwConfig
    mappings: list[Mapping]
    measurements: list[Any]  # backends.Measurement per layer
    model_edp: float
    measured_edp: float | None  # None: the backend gives no energy

    def to_dict(self) -> dict[str, Any]:
        return {"hw": self.hw.to_dict(), "model_edp": self.model_edp, "measured_edp": self.measured_edp}


def network_edp(layers: Sequence[Layer], measurements: Sequence[Any]) -> float | None:
    """BACO Eq. 6.9 on measurements: (Σ w·energy) × (Σ w·cycles); None when an energy is missing."""
    if any(m.energy_pj is None for m in measurements):
        return None
    cycles = sum(lay.weight * m.cycles for lay, m in zip(layers, measurements, strict=True))
    return float(cycles * sum(lay.weight * m.energy_pj for lay, m in zip(layers, measurements, strict=True)))


def measure_shortlist(
    backend: Any, layers: list[Layer], shortlist: Sequence[tuple[HwConfig, list[Mapping]]]
) -> list[Measured]:
    """Every shortlisted config measured by `backend` (all in one `measure_points` call), best measured first (by
    cycles where it gives no energy). A config whose tiles fit no dataflow of its array is skipped; raises
    ValueError when none is left."""
    options = [(hw, flow_options(hw, layers, maps)) for hw, maps in shortlist]
    out = [m for m in measure_options(backend, layers, options) if not isinstance(m, str)]
    if not out:
        raise ValueError("no shortlisted configuration could be measured")
    return ranked(layers, out)


def measure_options(
    backend: Any, layers: list[Layer], configs: Sequence[tuple[HwConfig, Sequence[Sequence[Mapping]]]]
) -> list[Measured | str]:
    """Each config with its layers' options (best_flow.py) measured in one `measure_points` call, in order: its
    layers' fastest options as `Measured`, or why a layer had none."""
    return [
        best if isinstance(best, str) else measured(hw, layers, *best)
        for (hw, _), best in zip(configs, measured_best_each(backend, layers, configs), strict=True)
    ]


def measured(hw: HwConfig, layers: list[Layer], mappings: list[Mapping], measurements: list[Any]) -> Measured:
    return Measured(
        hw, mappings, measurements, network_cost(hw, layers, mappings).edp, network_edp(layers, measurements)
    )


def ranked(layers: list[Layer], candidates: Sequence[Measured]) -> list[Measured]:
    """Lowest measured network EDP first (cycles where the backend gives no energy). With the default as gemmini.h
    tiles it among the candidates, the winner is never one the backend measures worse than what users run: a
    calibrated model can still mislead the search (a BERT FFN's shortlist all measured 0.64x the default)."""

    def key(m: Measured) -> tuple[float, float]:
        cycles = sum(lay.weight * r.cycles for lay, r in zip(layers, m.measurements, strict=True))
        return (m.measured_edp if m.measured_edp is not None else float("inf"), cycles)

    return sorted(candidates, key=key)
