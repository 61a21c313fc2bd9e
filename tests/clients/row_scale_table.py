"""A test-only fourth table family for the SDK layer: its table variant and its loader, in this one module and
registered from it (no product module names it). `row_scale` scales a layer's rows by a per-interval factor."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernelfleet.dispatch_cache import DispatchCache, register_loader
from kernelfleet.epilogue import Epilogue
from kernelfleet.models import DispatchDoc
from kernelfleet.tables import TableVariant, register_table


@register_table
@dataclass(frozen=True)
class RowScaleTable(TableVariant):
    kind = "row_scale"
    s_max: int
    factor: float

    def _body(self) -> dict[str, Any]:
        return {"s_max": self.s_max, "factor": self.factor}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RowScaleTable:
        return cls(int(data["s_max"]), float(data["factor"]))


@dataclass(frozen=True)
class RowScaleDispatcher:
    table: RowScaleTable
    source: str

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x * np.float32(self.table.factor)


def load_row_scale(
    doc: DispatchDoc, table: RowScaleTable, cache: DispatchCache, source: str, epilogue: Epilogue | None
) -> RowScaleDispatcher:
    return RowScaleDispatcher(table, source)


register_loader(RowScaleTable.kind, load_row_scale)
