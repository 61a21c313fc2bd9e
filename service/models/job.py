"""Tuning jobs: what a user submits and what the service reports back."""

from __future__ import annotations

import enum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import PydanticCustomError

from service.models.distribution import ShapeDistribution
from service.models.target import TargetSpec
from service.models.workload import WorkloadSpec

JobKind = str  # a name from the job-kind registry (service.tuning.kinds), checked at submission


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


def _spec_or_hash(value: Any, handler: ValidatorFunctionWrapHandler) -> WorkloadSpec | str:
    """An object is a workload spec and a string a hash: validate as that alone, so a bad spec gets its own
    errors at the spec's fields, with no second error saying it is not a string either."""
    if isinstance(value, str | WorkloadSpec):
        return handler(value)  # type: ignore[no-any-return]
    if not isinstance(value, dict):
        raise PydanticCustomError("workload_type", "expected a workload spec (an object) or a workload hash (a string)")
    return WorkloadSpec.model_validate(value)


class JobSpec(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "kind": "sketch",
                    "workload": {"op": "dense", "dims": {"N": 2304, "K": 768}, "symbolic": ["M"]},
                    "target": {"kind": "llvm", "mcpu": "host"},
                    "distribution": {"kind": "zipf", "dim": "M", "low": 1, "high": 128, "s": 1.1},
                    "budget": {"trials": 64, "max_shapes": 4},
                }
            ]
        },
    )

    kind: JobKind = Field(
        default="sketch",
        pattern=r"^[a-z][a-z0-9_]{0,31}$",
        description="the tuning algorithm: sketch, ukernel, ...; GET /v1/kinds lists what this service runs",
    )
    workload: Annotated[WorkloadSpec | str, WrapValidator(_spec_or_hash)] = Field(
        description="an inline workload spec or a registered workload hash"
    )
    target: TargetSpec
    distribution: ShapeDistribution
    budget: Budget = Field(default_factory=Budget)
    tags: dict[str, str] = Field(default_factory=dict, max_length=16)
