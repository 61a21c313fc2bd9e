"""What the tuning engine accepts: the checks a request must pass that need the kind and platform registries.

The domain models validate what they can alone (types, bounds, a workload's own consistency); whether a
target's platform exists and takes it, whether a kind tunes a job, and whether an imported config is one
a kind serves are answered here, and the API calls these at submission. Each answer is a `Problem` whose
`loc` is the field under the request body, so the API's 422 names it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from service.models import Budget, TargetSpec, WorkloadSpec
from service.models.distribution import Explicit, ShapeDistribution, ShapePoint, dims_of
from service.settings import get_settings
from service.tuning.kinds import KINDS, JobKind, Problem
from service.tuning.platforms import PLATFORMS


def check_target(target: TargetSpec) -> Problem | None:
    """Why `target` is no complete target of a known platform (loc under the target), or None.

    A target naming the host alias (`mcpu: "host"`) is complete once resolved against the live workers."""
    if target.kind not in PLATFORMS.names():
        return Problem(("kind",), f"unknown platform {target.kind!r}; known: {', '.join(PLATFORMS.names())}")
    limit = get_settings().max_target_details_bytes
    for field in ("details", "metadata"):  # both are stored with the target: their size must be bounded
        size = len(json.dumps(getattr(target, field), separators=(",", ":")).encode())
        if size > limit:
            return Problem((field,), f"{size} bytes of JSON; at most {limit} (KERNELFLEET_MAX_TARGET_DETAILS_BYTES)")
    if target.is_host_alias:
        return None
    problem = PLATFORMS.get(target.kind).validate(target)
    return Problem((), problem) if problem else None


def check_kind(kind_name: str) -> Problem | None:
    if kind_name not in KINDS.names():
        return Problem(("kind",), f"unknown job kind {kind_name!r}; known: {', '.join(KINDS.names())}")
    return None


def check_job(
    kind_name: str,
    workload: WorkloadSpec,
    distribution: ShapeDistribution,
    target: TargetSpec,
    budget: Budget,
    tags: Mapping[str, str] | None = None,
) -> Problem | None:
    """Every check a job spec must pass before it is accepted, with the field to blame."""
    if problem := check_kind(kind_name):
        return problem
    if problem := check_target(target):
        return Problem(("target", *problem.loc), problem.message)
    kind = KINDS.get(kind_name)
    if target.kind not in kind.target_kinds:
        allowed = ", ".join(sorted(kind.target_kinds))
        return Problem(("target", "kind"), f"{kind.name} jobs tune {allowed} targets, not {target.kind}")
    if workload.dtype not in kind.dtypes:
        allowed = ", ".join(sorted(kind.dtypes))
        return Problem(("workload", "dtype"), f"{kind.name} jobs tune {allowed} workloads, not {workload.dtype}")
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
    return kind.check_tags(tags or {}) or kind.validate(workload, distribution, target, budget)


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
    if not workload.symbolic:
        return None
    probe = Explicit(points=[ShapePoint(shape={d: 1 for d in workload.symbolic})])
    accepted = [k for k in KINDS.all() if check_job(k.name, workload, probe, target, Budget()) is None]
    return max(accepted, key=lambda k: k.fleet_priority, default=None)
