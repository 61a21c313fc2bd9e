"""Measurement backends behind one interface (`Backend.measure`), chosen per worker by name.

- `zigzag`: ZigZag (PyPI zigzag-dse), a third-party analytical DSE framework; scores the chosen hardware
  config with the fixed mapping (temporal ordering given, not searched). The default.
- `scalesim`: SCALE-Sim 3 (PyPI scalesim), a cycle-level systolic-array simulator; hardware only (it has no
  notion of tiles), small shapes, in its own virtualenv (numpy<2.4) and process (it calls exit()).
- `firesim`: the production adapter for FireSim FPGA simulation of Gemmini RTL.
"""

from __future__ import annotations

from service.tuning.gemmini.backends.base import Backend, BackendError, Measurement


def get_backend(name: str, **options: object) -> Backend:
    if name == "zigzag":
        from service.tuning.gemmini.backends.zigzag import ZigZagBackend

        return ZigZagBackend(**options)  # type: ignore[arg-type]
    if name == "scalesim":
        from service.tuning.gemmini.backends.scalesim import ScaleSimBackend

        return ScaleSimBackend(**options)  # type: ignore[arg-type]
    if name == "firesim":
        from service.tuning.gemmini.backends.firesim import FireSimBackend

        return FireSimBackend(**options)  # type: ignore[arg-type]
    raise KeyError(f"unknown gemmini backend {name!r}; known: zigzag, scalesim, firesim")


BACKEND_NAMES = ("zigzag", "scalesim", "firesim")

__all__ = ["BACKEND_NAMES", "Backend", "BackendError", "Measurement", "get_backend"]
