"""Tuning jobs: what a user submits and what the service reports back."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from service.models.distribution import ShapeDistribution
from service.models.target import TargetSpec
from service.models.workload import WorkloadSpec

JobKind = Literal["sketch", "ukernel"]

# Which target kinds each job kind can tune; the API rejects other pairs up front.
KIND_TARGETS: dict[str, frozenset[str]] = {"sketch": frozenset({"llvm"}), "ukernel": frozenset({"llvm"})}

UKERNEL_MAX_S = 4096  # the largest dynamic-dimension value a ukernel job tunes (tables extend beyond it)


def kind_problem(kind: str, workload: WorkloadSpec, distribution: ShapeDistribution) -> tuple[str, str] | None:
    """(field, why) when a job of `kind` cannot tune this workload and distribution, else None."""
    if kind != "ukernel":
        return None
    if workload.op != "dense" or workload.attrs.get("bias"):
        return "workload", "ukernel jobs tune dense layers without bias (op 'dense')"
    if workload.symbolic != ["M"]:
        return "workload", f"ukernel jobs need exactly one dynamic dimension, M; this workload has {workload.symbolic}"
    if workload.dtype != "float32":
        return "workload", f"ukernel jobs support float32, not {workload.dtype}"
    s_max = max(shape["M"] for shape, _ in distribution.support())
    if s_max > UKERNEL_MAX_S:
        return "distribution", f"ukernel jobs tune M up to {UKERNEL_MAX_S}; the distribution reaches {s_max}"
    return None


class JobState(enum.StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobState.succeeded, JobState.failed, JobState.cancelled)


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trials: int = Field(
        default=64,
        ge=1,
        le=100_000,
        description="sketch: measured candidates across all shapes; ukernel: uKernels built and measured (≤ 8 used)",
    )
    max_shapes: int = Field(
        default=4, ge=1, le=128, description="sketch: hot shapes tuned; ukernel: hot shapes measured to validate"
    )
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)


class JobSpec(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "kind": "sketch",
                    "workload": {"op": "dense", "dims": {"N": 2304, "K": 768}, "symbolic": ["M"]},
                    "target": {"kind": "llvm", "mcpu": "znver4", "num_cores": 2},
                    "distribution": {"kind": "zipf", "dim": "M", "low": 1, "high": 128, "s": 1.1},
                    "budget": {"trials": 64, "max_shapes": 4},
                }
            ]
        },
    )

    kind: JobKind = "sketch"
    workload: WorkloadSpec | str = Field(description="an inline workload spec or a registered workload hash")
    target: TargetSpec
    distribution: ShapeDistribution
    budget: Budget = Field(default_factory=Budget)
    tags: dict[str, str] = Field(default_factory=dict, max_length=16)


class ShapeResult(BaseModel):
    shape: dict[str, int]
    weight: float
    priority: float
    trials: int
    trials_done: int
    state: JobState
    best_latency_s: float | None = None
    baseline: str | None = None
    baseline_latency_s: float | None = None

    @property
    def speedup(self) -> float | None:
        if self.best_latency_s and self.baseline_latency_s:
            return self.baseline_latency_s / self.best_latency_s
        return None


class JobView(BaseModel):
    id: str
    kind: JobKind
    state: JobState
    workload_hash: str
    target: TargetSpec
    target_fingerprint: str | None
    distribution: ShapeDistribution
    budget: Budget
    tags: dict[str, str]
    progress: float = Field(ge=0, le=1)
    trials_done: int
    trials_total: int
    error: str | None
    attempts: int
    worker: str | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    heartbeat_at: dt.datetime | None
    shapes: list[ShapeResult] = Field(default_factory=list)


class JobList(BaseModel):
    jobs: list[JobView]
    total: int
