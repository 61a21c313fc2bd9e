"""Plain-JSON forms of MetaSchedule objects (their `as_json()` holds TVM IntImm/FloatImm/Array/Map)."""

from __future__ import annotations

from typing import Any

import tvm

# MetaSchedule stores failed candidates with this run time (1e10 s in its databases).
FAILED_RUN_SECS = 1e9


def to_py(obj: Any) -> Any:
    if obj is None or isinstance(obj, str | bool | int | float):
        return obj
    if isinstance(obj, tvm.tirx.IntImm):
        return int(obj.value)
    if isinstance(obj, tvm.tirx.FloatImm):
        return float(obj.value)
    if hasattr(obj, "items"):
        return {str(k): to_py(v) for k, v in obj.items()}
    if hasattr(obj, "__len__"):
        return [to_py(x) for x in obj]
    return str(obj)
