"""The `zigzag` backend: ZigZag (PyPI zigzag-dse) scores each layer's fixed mapping on the hardware config.

Scratchpad and accumulator energies per access come from CACTI 7 at the config's bank geometry (`area.py`,
the same runs as the area model), not from the analytical model's Table 6.3 fits: `sram_energy="table63"`
restores those (then ZigZag largely re-derives the model's own numbers)."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import metadata

from service.tuning.gemmini.area import sram_energies
from service.tuning.gemmini.backends.base import (
    CHILDREN,
    MAIN_PYTHON,
    Backend,
    BackendError,
    Measurement,
    layer_payload,
    run_child,
)
from service.tuning.gemmini.space import HwConfig, Layer, Mapping
from service.tuning.gemmini.sram import CactiError

POINTS_PER_CHILD = 100  # points scored by one child process (one `timeout_s` each)


class ZigZagBackend(Backend):
    name = "zigzag"

    def __init__(self, timeout_s: float = 120.0, sram_energy: str = "cacti") -> None:
        if sram_energy not in ("cacti", "table63"):
            raise ValueError(f"sram_energy {sram_energy!r}: cacti or table63")
        self.timeout_s = timeout_s
        self.sram_energy = sram_energy

    def available(self) -> str | None:
        try:
            metadata.version("zigzag-dse")
        except metadata.PackageNotFoundError:
            return "zigzag-dse is not installed (pip install zigzag-dse six)"
        return None

    def version(self) -> str:
        base = f"zigzag-dse-{metadata.version('zigzag-dse')}"
        return f"{base}+cacti-sram" if self.sram_energy == "cacti" else base

    def measure(self, hw: HwConfig, layers: list[Layer], mappings: list[Mapping]) -> list[Measurement]:
        return self.measure_points([(hw, lay, m) for lay, m in zip(layers, mappings, strict=True)])

    def measure_points(self, points: Sequence[tuple[HwConfig, Layer, Mapping]]) -> list[Measurement]:
        """Every point in one child process (starting one costs ~4.5 s, a point 0.05-0.2 s)."""
        items = []
        for hw, lay, m in points:
            item = layer_payload(hw, lay, m)
            if self.sram_energy == "cacti":
                try:
                    item["sram"] = sram_energies(hw)
                except (CactiError, ValueError) as exc:
                    raise BackendError(f"zigzag: CACTI for {hw}: {exc}") from exc
            items.append(item)
        results = []
        for at in range(0, len(items), POINTS_PER_CHILD):  # each child run gets `timeout_s`
            try:
                chunk = {"items": items[at : at + POINTS_PER_CHILD]}
                results += run_child(MAIN_PYTHON, CHILDREN / "zigzag_child.py", chunk, self.timeout_s)["results"]
            except BackendError as exc:
                raise BackendError(f"zigzag on {sorted({lay.name for _, lay, _ in points})}: {exc}") from exc
        out = []
        for (_, layer, _), r in zip(points, results, strict=True):
            keys = ("seconds", "padded_to_tiles", "temporal_ordering", "dataflow_modelled", "sram_energy")
            detail = {k: r[k] for k in keys}
            out.append(Measurement(self.name, layer.name, r["cycles"], r["energy_pj"], detail))
        return out
