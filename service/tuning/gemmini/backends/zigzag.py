"""The `zigzag` backend: ZigZag (PyPI zigzag-dse) scores each layer's fixed mapping on the hardware config.

Scratchpad and accumulator energies per access come from CACTI 7 at the config's bank geometry (`area.py`,
the same runs as the area model), not from the analytical model's Table 6.3 fits: `sram_energy="table63"`
restores those (then ZigZag largely re-derives the model's own numbers)."""

from __future__ import annotations

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
        items = [layer_payload(hw, lay, m) for lay, m in zip(layers, mappings, strict=True)]
        if self.sram_energy == "cacti":
            try:
                sram = sram_energies(hw)
            except (CactiError, ValueError) as exc:
                raise BackendError(f"zigzag: CACTI for {hw}: {exc}") from exc
            items = [{**it, "sram": sram} for it in items]
        try:
            answer = run_child(MAIN_PYTHON, CHILDREN / "zigzag_child.py", {"items": items}, self.timeout_s)
        except BackendError as exc:
            raise BackendError(f"zigzag on {[lay.name for lay in layers]}: {exc}") from exc
        out = []
        for layer, r in zip(layers, answer["results"], strict=True):
            keys = ("seconds", "padded_to_tiles", "temporal_ordering", "dataflow_modelled", "sram_energy")
            detail = {k: r[k] for k in keys}
            out.append(Measurement(self.name, layer.name, r["cycles"], r["energy_pj"], detail))
        return out
