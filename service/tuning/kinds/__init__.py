"""Job kinds, one module each, looked up by name.

Adding a kind: write `service/tuning/kinds/<name>.py` with a `JobKind` subclass and add its line to
`KINDS` below (or register it from a plugin module named in KERNELFLEET_PLUGINS: `KINDS.register(...)`).
What every kind checks before a job is accepted is in `service.tuning.admission`.
"""

from __future__ import annotations

from service.registry import Registry
from service.tuning.kinds.base import (
    DispatchPublication,
    JobKind,
    JobSink,
    Plan,
    Problem,
    ShapeOutcome,
    UnitContext,
    UnitResult,
    WorkUnit,
    unit_done,
)

KINDS: Registry[JobKind] = Registry(
    "job kind",
    {
        "sketch": "service.tuning.kinds.sketch:SketchKind",
        "ukernel": "service.tuning.kinds.ukernel:UKernelKind",
        "pipeline": "service.tuning.kinds.pipeline:PipelineKind",
        "gemmini": "service.tuning.kinds.gemmini:GemminiKind",
    },
)


__all__ = [
    "KINDS",
    "DispatchPublication",
    "JobKind",
    "JobSink",
    "Plan",
    "Problem",
    "ShapeOutcome",
    "UnitContext",
    "UnitResult",
    "WorkUnit",
    "unit_done",
]
