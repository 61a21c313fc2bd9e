"""The analytical model calibrated to a measuring backend, per layer family (issue 36 item 3: one objective).

BACO's model agrees with ZigZag on cycles (r 0.999) but not on energy: it prices SRAM with Table 6.3's fits and
counts conv accesses its own way, ZigZag with CACTI and its own access counts (1.5-3.8x apart on convs), so the
model's best point can be one the backend measures worse than the default. A `Calibration` is fitted to backend
measurements of a sample of configs per layer family (GEMM, GEMV, 1x1 conv, other convs) and dataflow:
- cycles: log(measured) = a + b·log(model), least squares;
- energy: measured ≈ Σ w_g · term_g over the model's own energy terms (`model.energy_terms`, grouped: MACs with
  PE registers, accumulator, scratchpad, DRAM), non-negative weights fitted on relative error with a weak pull
  towards 1 (the model as published), so a term the sample hardly exercises stays close to the model.
The search then optimises the calibrated model (`Calibration.cost`), and the backend still re-scores the
shortlist it returns (backend_pick.py). `agreement` says, per layer, how well model and calibrated model rank
configs as the backend does on points the fit did not see; `correlate` keeps the older whole-sample figures.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from service.tuning.gemmini.gemmini_h import default_mapping
from service.tuning.gemmini.model import Cost, energy_terms, flow_cost, layer_cost
from service.tuning.gemmini.space import DEFAULT_HW, HwConfig, Layer, LayerFlow, Mapping, fit
from service.tuning.tuners.gemmini.search import Limits, random_hw, random_mapping
from service.tuning.tuners.rank_stats import spearman

# the model's energy terms as the fit weighs them: MACs and PE registers together, since the model counts two
# register accesses per padded MAC (the two would be collinear), then each memory level
GROUPS = {
    "compute": ("mac", "register"),
    "accumulator": ("accumulator",),
    "scratchpad": ("scratchpad",),
    "dram": ("dram",),
}
MIN_POINTS = 6  # fewer measured points in a family: the model is used uncalibrated for it
CALIBRATION_POINTS = 12  # per family and dataflow in a job: one ZigZag run of ~5-10 s
PRIOR = 0.01  # weight of the pull of each energy weight towards 1, against ~1 per point on relative error
Point = tuple[HwConfig, Layer, Mapping]  # a mapping with its dataflow pinned


def family(layer: Layer, flow: str) -> str:
    """The layer's family and dataflow: each flow has its own array model in both (ZigZag's OS GEMMs run
    1.3-1.9x slower than the model says, its WS ones 1.1-1.3x faster), so each pair gets its own fit."""
    if layer.op == "gemm":
        return f"{'gemv' if layer.size('N') == 1 else 'gemm'} {flow}"
    return f"{'conv 1x1' if layer.R * layer.S == 1 else 'conv'} {flow}"


@dataclass(frozen=True)
class FamilyFit:
    family: str
    n: int  # measured points it was fitted on
    cycles: tuple[float, float]  # (a, b): log(measured) = a + b·log(model)
    energy: dict[str, float]  # weight of each group of model energy terms (GROUPS)

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "n": self.n, "cycles": list(self.cycles), "energy": dict(self.energy)}


@dataclass(frozen=True)
class Calibration:
    backend: str
    fits: dict[str, FamilyFit]

    def adjust(self, hw: HwConfig, layer: Layer, cost: Cost) -> Cost:
        """`cost` as the backend would measure it, by the layer's family fit (unchanged without one)."""
        f = self.fits.get(family(layer, cost.dataflow))
        if f is None:
            return cost
        a, b = f.cycles
        terms = _grouped(hw, cost)
        return replace(
            cost,
            cycles=math.exp(a + b * math.log(cost.cycles)),
            energy_pj=sum(f.energy[g] * terms[g] for g in GROUPS),
        )

    def cost(self, hw: HwConfig, layer: Layer, m: Mapping) -> Cost:
        """What the search scores: the model's cost calibrated, the flow chosen on calibrated EDP."""
        return layer_cost(hw, layer, m, self.adjust)

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "families": {k: f.to_dict() for k, f in sorted(self.fits.items())}}


def calibration_sample(layers: Sequence[Layer], per_family: int, seed: int, limits: Limits = Limits()) -> list[Point]:
    """`per_family` points for each family among `layers` (its layers in turn) and each dataflow `limits` allow
    it: random legal hardware within `limits` that runs that flow (the default's first where the limits allow
    it), half with gemmini.h's tiling and half with random tiles, where they fit."""
    rng = random.Random(seed)
    groups: dict[tuple[str, LayerFlow], list[Layer]] = {}
    for lay in layers:
        for f in {f for d in limits.dataflows for f in HwConfig(dataflow=d).flows(lay)}:
            groups.setdefault((family(lay, f), f), []).append(lay)
    out: list[Point] = []
    for (_, flow), members in sorted(groups.items()):
        got, tries = 0, 0
        while got < per_family and tries < per_family * 50:
            tries += 1
            layer = members[got % len(members)]
            use_default = tries == 1 and limits.allows(DEFAULT_HW) and DEFAULT_HW.dma_buswidth in limits.buses
            hw = DEFAULT_HW if use_default else random_hw(rng, limits)
            tiles = default_mapping(hw, layer) if got % 2 == 0 else random_mapping(hw, layer, rng)
            if flow not in hw.flows(layer) or fit(hw, layer, tiles.with_flow(flow)) is not None:
                continue
            out.append((hw, layer, tiles.with_flow(flow)))
            got += 1
    return out


def calibrate(
    backend: Any,
    layers: Sequence[Layer],
    seed: int,
    limits: Limits = Limits(),
    per_family: int | None = None,
    known: Sequence[tuple[Point, Any]] = (),
) -> tuple[Calibration, int]:
    """The model fitted to `backend` on a fresh sample (one `measure_points` call) plus `known` points the
    backend measured already, and the number of points it was fitted on. A backend that gives no energy leaves
    every family uncalibrated."""
    points = calibration_sample(layers, per_family or CALIBRATION_POINTS, seed, limits)
    measured = list(backend.measure_points(points)) if points else []
    points += [p for p, _ in known]
    measured += [m for _, m in known]
    return fit_calibration(points, measured, backend.version()), len(points)


def model_costs(points: Sequence[Point]) -> list[Cost]:
    """The model's cost of each point in its pinned dataflow."""
    return [flow_cost(hw, lay, m, m.flow or "WS") for hw, lay, m in points]


def fit_calibration(points: Sequence[Point], measured: Sequence[Any], backend: str) -> Calibration:
    """Per family, the cycle and energy fits of the model to `measured` (backend Measurements, one per point);
    families with fewer than MIN_POINTS points with an energy are left uncalibrated."""
    rows: dict[str, list[tuple[HwConfig, Cost, Any]]] = {}
    for (hw, lay, _), cost, meas in zip(points, model_costs(points), measured, strict=True):
        if meas.energy_pj is not None and meas.cycles > 0 and meas.energy_pj > 0:
            rows.setdefault(family(lay, cost.dataflow), []).append((hw, cost, meas))
    fits = {}
    for fam, items in rows.items():
        if len(items) < MIN_POINTS:
            continue
        x = np.log([c.cycles for _, c, _ in items])
        y = np.log([m.cycles for _, _, m in items])
        b, a = np.polyfit(x, y, 1)
        terms = np.array([list(_grouped(hw, c).values()) for hw, c, _ in items])
        target = np.array([m.energy_pj for _, _, m in items])
        weights = _nonnegative_ridge(terms / target[:, None], np.ones(len(items)), PRIOR * len(items))
        fits[fam] = FamilyFit(
            fam, len(items), (float(a), float(b)), dict(zip(GROUPS, map(float, weights), strict=True))
        )
    return Calibration(backend, fits)


def _grouped(hw: HwConfig, cost: Cost) -> dict[str, float]:
    terms = energy_terms(hw, cost)
    return {g: sum(terms[t] for t in members) for g, members in GROUPS.items()}


def _nonnegative_ridge(a: np.ndarray, y: np.ndarray, strength: float) -> np.ndarray:
    """argmin ‖a·w − y‖² + strength·‖w − 1‖² over w ≥ 0: solved unconstrained, then the weights that come out
    negative are pinned at 0 and the rest solved again, until none is (four unknowns: a few rounds)."""
    n = a.shape[1]
    free = np.ones(n, dtype=bool)
    w = np.zeros(n)
    for _ in range(n):
        sub = np.vstack([a[:, free], math.sqrt(strength) * np.eye(n)[free][:, free]])
        rhs = np.concatenate([y, math.sqrt(strength) * np.ones(int(free.sum()))])
        w = np.zeros(n)
        w[free] = np.linalg.lstsq(sub, rhs, rcond=None)[0]
        if (w >= 0).all():
            return w
        free &= w > 0
    return np.clip(w, 0, None)


def agreement(
    points: Sequence[Point], measured: Sequence[Any], calibration: Calibration
) -> dict[str, dict[str, float | int]]:
    """Per layer, on `points` (best: ones the fit did not see): Spearman's rank correlation of EDP with the
    backend's, and the median |log(EDP / measured EDP)|, for the model and for the calibrated model."""
    by_layer: dict[str, list[tuple[float, float, float]]] = {}
    for (hw, lay, _), cost, meas in zip(points, model_costs(points), measured, strict=True):
        if meas.energy_pj is None:
            continue
        fitted = calibration.adjust(hw, lay, cost)
        by_layer.setdefault(lay.name, []).append((cost.edp, fitted.edp, meas.cycles * meas.energy_pj))
    out: dict[str, dict[str, float | int]] = {}
    for name, rows in by_layer.items():
        raw, cal, real = ([r[i] for r in rows] for i in range(3))
        out[name] = {
            "n": len(rows),
            "spearman_model": _spearman(raw, real),
            "spearman_calibrated": _spearman(cal, real),
            "log_error_model": float(np.median([abs(math.log(p / q)) for p, q in zip(raw, real, strict=True)])),
            "log_error_calibrated": float(np.median([abs(math.log(p / q)) for p, q in zip(cal, real, strict=True)])),
        }
    return out


def _pearson(x: Sequence[float], y: Sequence[float]) -> float:
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sx = math.sqrt(sum((a - mx) ** 2 for a in x))
    sy = math.sqrt(sum((b - my) ** 2 for b in y))
    return sxy / (sx * sy) if sx > 0 and sy > 0 else float("nan")


def _spearman(x: Sequence[float], y: Sequence[float]) -> float:
    return spearman(x, y) if len(x) >= 3 else float("nan")


def correlate(model: Sequence[float], measured: Sequence[float], backend: str) -> dict[str, Any]:
    """Pearson's r on cycles (and on log-cycles, which is what ranks candidates across shapes of very different
    size), Spearman's rank correlation, and a least-squares fit measured ≈ a·model + b."""
    if len(model) != len(measured) or len(model) < 3:
        return {"backend": backend, "n": len(model), "note": "need at least 3 paired points"}
    n = len(model)
    mx, my = sum(model) / n, sum(measured) / n
    var = sum((a - mx) ** 2 for a in model)
    a = sum((p - mx) * (q - my) for p, q in zip(model, measured, strict=True)) / var if var else float("nan")
    return {
        "backend": backend,
        "n": n,
        "pearson_r": _pearson(model, measured),
        "pearson_r_log": _pearson([math.log(v) for v in model], [math.log(v) for v in measured]),
        "spearman_rho": _spearman(model, measured),
        "fit": {"a": a, "b": my - a * mx},
    }
