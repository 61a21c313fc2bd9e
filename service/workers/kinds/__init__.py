"""Job kinds, one module each, looked up by name.

Adding a kind: write `service/workers/kinds/<name>.py` with a `JobKind` subclass and add its line to
`KINDS` below (or register it from a plugin module named in KERNELFLEET_PLUGINS: `KINDS.register(...)`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.models import Budget, TargetSpec, WorkloadSpec
from service.models.distribution import ShapeDistribution
from service.registry import Registry
from service.workers.kinds.base import (
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
        "sketch": "service.workers.kinds.sketch:SketchKind",
        "ukernel": "service.workers.kinds.ukernel:UKernelKind",
        "pipeline": "service.workers.kinds.pipeline:PipelineKind",
        "gemmini": "service.workers.kinds.gemmini:GemminiKind",
    },
)


def check_job(
    kind_name: str, workload: WorkloadSpec, distribution: ShapeDistribution, target: TargetSpec, budget: Budget
) -> Problem | None:
    """Every check a job spec must pass before it is accepted, with the field to blame."""
    kind = KINDS.get(kind_name)
    if target.kind not in kind.target_kinds:
        allowed = ", ".join(sorted(kind.target_kinds))
        return Problem(("target", "kind"), f"{kind.name} jobs tune {allowed} targets, not {target.kind}")
    from service.models.distribution import dims_of

    dims = dims_of(distribution)
    if dims != set(workload.symbolic):
        return Problem(
            ("distribution",),
            f"the distribution covers {sorted(dims)} but the workload's symbolic dims are {workload.symbolic}",
        )
    for shape, _ in distribution.support():
        try:
            workload.bind(shape)
        except ValueError as exc:
            return Problem(("distribution",), str(exc))
    return kind.validate(workload, distribution, target, budget)


def check_imported_config(config: Mapping[str, Any]) -> Problem | None:
    """Why a config brought in from elsewhere cannot be served per shape (loc under the config), or None.

    Its `format` names the kind that reads it; that kind must publish per-shape configs, and the config
    must match the kind's schema."""
    fmt = config.get("format")
    served = sorted({f for k in KINDS.all() if k.publishes == "configs" and (f := k.config_format())})
    for kind in KINDS.all():
        if kind.config_format() != fmt or fmt is None:
            continue
        if kind.publishes != "configs":
            why = f"{fmt} configs are {kind.name} candidates, not served per shape"
            return Problem(("format",), f"{why}; importable formats: {', '.join(served)}")
        return kind.check_config(config)
    return Problem(("format",), f"unknown config format {fmt!r}; importable formats: {', '.join(served)}")


def fleet_kind(workload: WorkloadSpec, target: TargetSpec) -> JobKind | None:
    """The kind the fleet loop uses for a task: the highest-priority kind that accepts it."""
    from service.models.distribution import Explicit, ShapePoint

    if not workload.symbolic:
        return None
    probe = Explicit(points=[ShapePoint(shape={d: 1 for d in workload.symbolic})])
    accepted = [k for k in KINDS.all() if check_job(k.name, workload, probe, target, Budget()) is None]
    return max(accepted, key=lambda k: k.fleet_priority, default=None)


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
    "check_imported_config",
    "check_job",
    "fleet_kind",
    "unit_done",
]
