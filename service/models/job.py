"""Tuning jobs: what a user submits and what the service reports back."""

from __future__ import annotations

import enum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import PydanticCustomError

from service.models.distribution import ShapeDistribution
from service.models.fields import HexId, Int, RegistryName, Tags
from service.models.target import TargetSpec
from service.models.workload import WorkloadSpec


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

    trials: Int = Field(
        default=64,
        ge=1,
        le=100_000,
        description="sketch: measured candidates across all shapes; ukernel: uKernels built and measured (≤ 8 used)",
    )
    max_shapes: Int = Field(
        default=4, ge=1, le=128, description="sketch: hot shapes tuned; ukernel: hot shapes measured to validate"
    )
    seed: Int | None = Field(default=None, ge=0, le=2**31 - 1)


_HASH: TypeAdapter[str] = TypeAdapter(HexId)


def _spec_or_hash(value: Any, handler: ValidatorFunctionWrapHandler) -> WorkloadSpec | str:
    """An object is a workload spec and a string a hash: validate as that alone, so a bad spec gets its own
    errors at the spec's fields, with no second error saying it is not a string either."""
    if isinstance(value, str):
        return _HASH.validate_python(value)
    if isinstance(value, WorkloadSpec):
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

    kind: RegistryName = Field(
        default="sketch",
        description="the tuning algorithm: sketch, ukernel, ...; GET /v1/kinds lists what this service runs",
    )
    workload: Annotated[WorkloadSpec | HexId, WrapValidator(_spec_or_hash)] = Field(
        description="an inline workload spec or a registered workload hash"
    )
    target: TargetSpec
    distribution: ShapeDistribution
    budget: Budget = Field(default_factory=Budget)
    tags: Tags = Field(default_factory=dict)
