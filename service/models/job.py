"""Tuning jobs: what a user submits and what the service reports back."""

from __future__ import annotations

import datetime as dt
import enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from service.models.distribution import ShapeDistribution
from service.models.target import TargetSpec
from service.models.workload import WorkloadSpec

JobKind = Literal["sketch"]

# Which target kinds each job kind can tune; the API rejects other pairs up front.
KIND_TARGETS: dict[str, frozenset[str]] = {"sketch": frozenset({"llvm"})}


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

    trials: int = Field(default=64, ge=1, le=100_000, description="measured candidates across all shapes")
    max_shapes: int = Field(default=4, ge=1, le=128, description="hot shapes tuned, by FLOPs × weight")
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
