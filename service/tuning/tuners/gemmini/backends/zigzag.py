"""The `zigzag` backend: ZigZag (PyPI zigzag-dse) scores each layer's fixed mapping on the hardware config."""

from __future__ import annotations

from importlib import metadata

from service.tuning.tuners.gemmini.backends.base import (
    CHILDREN,
    MAIN_PYTHON,
    Backend,
    BackendError,
    Measurement,
    layer_payload,
    run_child,
)
from service.tuning.tuners.gemmini.space import HwConfig, Layer, Mapping


class ZigZagBackend(Backend):
    name = "zigzag"

    def __init__(self, timeout_s: float = 120.0) -> None:
        self.timeout_s = timeout_s

    def available(self) -> str | None:
        try:
            metadata.version("zigzag-dse")
        except metadata.PackageNotFoundError:
            return "zigzag-dse is not installed (pip install zigzag-dse six)"
        return None

    def version(self) -> str:
        return f"zigzag-dse-{metadata.version('zigzag-dse')}"

    def measure(self, hw: HwConfig, layers: list[Layer], mappings: list[Mapping]) -> list[Measurement]:
        items = [layer_payload(hw, lay, m) for lay, m in zip(layers, mappings, strict=True)]
        try:
            answer = run_child(MAIN_PYTHON, CHILDREN / "zigzag_child.py", {"items": items}, self.timeout_s)
        except BackendError as exc:
            raise BackendError(f"zigzag on {[lay.name for lay in layers]}: {exc}") from exc
        out = []
        for layer, r in zip(layers, answer["results"], strict=True):
            detail = {k: r[k] for k in ("seconds", "padded_to_tiles", "temporal_ordering", "dataflow_modelled")}
            out.append(Measurement(self.name, layer.name, r["cycles"], r["energy_pj"], detail))
        return out
