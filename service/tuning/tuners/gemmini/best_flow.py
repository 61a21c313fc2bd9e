"""Each layer in its best dataflow as the reporting backend measures it (issue 36 item 1).

On a BOTH array gemmini.h runs a GEMM weight- or output-stationary, each with its own auto tiling; the analytical
model can price the two about equally while a backend measures one 1.6-1.7x slower (ZigZag on the default's QKV:
OS 603,136 cycles, WS 355,895). A baseline or a winner is shown at its best only if the backend that reports it
picks the flow: every layer is measured in each flow its hardware runs and its tiles fit, and the fewer cycles
win (energy on a tie).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from service.tuning.gemmini.gemmini_h import auto_mappings
from service.tuning.gemmini.space import HwConfig, Layer, Mapping, fit, fit_flow


def default_options(hw: HwConfig, layers: Sequence[Layer]) -> list[list[Mapping]]:
    """Per layer, gemmini.h's auto tiling for each dataflow the array runs, where it fits."""
    return [
        [m for m in auto_mappings(hw, lay) if m.flow is not None and fit_flow(hw, lay, m, m.flow) is None]
        for lay in layers
    ]


def flow_options(hw: HwConfig, layers: Sequence[Layer], mappings: Sequence[Mapping]) -> list[list[Mapping]]:
    """Per layer, its (searched) tiles in each dataflow the array runs, where they fit."""
    out = []
    for lay, m in zip(layers, mappings, strict=True):
        pinned = [m.with_flow(f) for f in hw.flows(lay)]
        out.append([p for p in pinned if fit(hw, lay, p) is None] or [m])
    return out


def measured_best(
    backend: Any, hw: HwConfig, layers: list[Layer], options: Sequence[Sequence[Mapping]]
) -> tuple[list[Mapping], list[Any]]:
    """(each layer's fastest option, its measurement); raises ValueError where a layer has no option."""
    (best,) = measured_best_each(backend, layers, [(hw, options)])
    if isinstance(best, str):
        raise ValueError(best)
    return best


def measured_best_each(
    backend: Any, layers: list[Layer], configs: Sequence[tuple[HwConfig, Sequence[Sequence[Mapping]]]]
) -> list[tuple[list[Mapping], list[Any]] | str]:
    """`measured_best` for several configs in one `measure_points` call (a ZigZag child costs ~4.5 s to start):
    per config, its layers' fastest options and their measurements, or why a layer had none."""
    points = [(hw, layers[i], m) for hw, options in configs for i, opts in enumerate(options) for m in opts]
    results = iter(backend.measure_points(points))
    out: list[tuple[list[Mapping], list[Any]] | str] = []
    for hw, options in configs:
        best: list[tuple[Mapping, Any] | None] = [None] * len(layers)
        for i, opts in enumerate(options):
            for m in opts:
                result = next(results)
                current = best[i]
                if current is None or _faster(result, current[1]):
                    best[i] = (m, result)
        missing = [layers[i].name for i, b in enumerate(best) if b is None]
        if missing:
            out.append(f"no dataflow of the {hw.dataflow} array fits the tiles of {', '.join(missing)}")
        else:
            out.append(([b[0] for b in best if b], [b[1] for b in best if b]))
    return out


def _faster(a: Any, b: Any) -> bool:
    if a.cycles != b.cycles:
        return bool(a.cycles < b.cycles)
    return a.energy_pj is not None and b.energy_pj is not None and a.energy_pj < b.energy_pj
