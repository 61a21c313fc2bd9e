"""The wire schema of the KernelFleet /v1 API: the bodies the service answers with, as pydantic models.

This module is the one source of that schema. The service imports these models as its response models
(and uses them inside, e.g. the store returns `ConfigRecord`s), so the SDK and the service cannot drift
apart. Request bodies are the service's to validate (service.models: the operator registry, shape
distributions, targets); the SDK sends them as plain JSON and surfaces the service's 422s.

Models accept unknown fields (`extra="allow"`), so an older SDK keeps working against a newer service.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

SHA256_PATTERN = r"^[0-9a-f]{64}$"
TERMINAL_STATES = ("succeeded", "failed", "cancelled")

# Every float that crosses the wire is finite. Python's json (and so Starlette's request parser) reads the
# literals NaN, Infinity and -Infinity, and 1e400 as inf; none of them is JSON, so they are refused here,
# at the schema, with an error naming the field. The service's request models use the same two types.
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


def non_finite(value: Any, path: tuple[str | int, ...] = ()) -> list[tuple[tuple[str | int, ...], float]]:
    """(path, value) of every non-finite float in a JSON-like value."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [(path, value)]
    if isinstance(value, Mapping):
        return [hit for k, v in value.items() for hit in non_finite(v, (*path, str(k)))]
    if isinstance(value, list | tuple):
        return [hit for i, v in enumerate(value) for hit in non_finite(v, (*path, i))]
    return []


def field_errors(title: str, errors: list[tuple[tuple[str | int, ...], str, Any]]) -> ValidationError:
    """A ValidationError with one error per (loc, message, input). Raised inside a validator, each loc continues
    the validated value's own, so a model-level check can name the field it blames."""
    return ValidationError.from_exception_data(
        title,
        [
            InitErrorDetails(type=PydanticCustomError("value_error", message), loc=loc, input=value)
            for loc, message, value in errors
        ],
    )


def _finite_json(value: dict[str, Any]) -> dict[str, Any]:
    bad = non_finite(value)
    if bad:
        message = "Input should be a finite number (JSON has no NaN or Infinity)"
        raise field_errors("FiniteJsonObject", [(path, message, repr(number)) for path, number in bad[:20]])
    return value


# A free-form JSON object (e.g. a config payload) whose numbers, at any depth, are finite.
FiniteJsonObject = Annotated[dict[str, Any], AfterValidator(_finite_json)]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class ShapeResult(_Wire):
    """One shape of a job: its share of the distribution, its trials and what tuning bought there."""

    shape: dict[str, int]
    weight: float
    priority: float = 0.0
    trials: int
    trials_done: int
    state: str
    best_latency_s: float | None = Field(
        default=None, description="the tuned kernel as an inference host calls it (Python call included)"
    )
    baseline: str | None = Field(default=None, description="the vendor library that ran, e.g. numpy (OpenBLAS ...)")
    baseline_latency_s: float | None = Field(default=None, description="the vendor library, called the same way")

    @property
    def speedup(self) -> float | None:
        if self.best_latency_s and self.baseline_latency_s:
            return self.baseline_latency_s / self.best_latency_s
        return None


class JobView(_Wire):
    """A tuning job: what was asked (target, distribution, budget as submitted), its state and results."""

    id: str
    kind: str
    state: str
    workload_hash: str
    target: dict[str, Any]
    target_fingerprint: str | None
    distribution: dict[str, Any] = Field(default_factory=dict)
    budget: dict[str, Any] = Field(default_factory=dict)
    tags: dict[str, str] = Field(default_factory=dict)
    progress: float = Field(ge=0, le=1)
    trials_done: int
    trials_total: int
    error: str | None
    attempts: int
    worker: str | None = None
    created_at: dt.datetime
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    heartbeat_at: dt.datetime | None = None
    cpu_seconds: float | None = Field(
        default=None, description="CPU seconds of its attempts that ended in a worker (builders included once reaped)"
    )
    waiting_for_worker: str | None = Field(
        default=None,
        description="set while the job is queued on a queue no live worker consumes: the queue's name",
    )
    published: bool | None = Field(
        default=None,
        description="whether the job published a config or a dispatch table (set when it ends); a job can "
        "succeed and publish nothing, e.g. when the vendor is faster as the SDK calls both",
    )
    publish_reason: str | None = Field(
        default=None, description="why something was not published (all of it when published is false)"
    )
    shapes: list[ShapeResult] = Field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES


class JobList(_Wire):
    jobs: list[JobView]
    total: int


class ConfigRecord(_Wire):
    """The best known config for one (workload, target fingerprint, shape)."""

    workload_hash: str
    target_fingerprint: str
    shape: dict[str, int]
    latency_s: FiniteFloat = Field(gt=0, description="the tuner's own measurement of the kernel (TVM's timing loop)")
    kind: str
    config: dict[str, Any] = Field(description="format-tagged payload, e.g. a MetaSchedule trace plus its IRModule")
    provenance: dict[str, Any] = Field(default_factory=dict)
    job_id: str | None = None
    updated_at: dt.datetime | None = None


class Workload(_Wire):
    """A registered workload: an operator from the registry with its static and symbolic dimensions."""

    workload_hash: str
    op: str
    dtype: str = "float32"
    dims: dict[str, int]
    symbolic: list[str]
    attrs: dict[str, int | bool | str] = Field(default_factory=dict)


class Target(_Wire):
    """A registered target and its fingerprint (hardware + toolchain: the key of every record)."""

    target_fingerprint: str
    kind: str
    mcpu: str | None = None
    arch: str | None = None
    num_cores: int = 1
    features: list[str] = Field(default_factory=list)
    details: dict[str, str | int] = Field(default_factory=dict)
    toolchain: dict[str, str] | None = None


class UKernelRef(_Wire):
    """One compiled uKernel: its id in the table, the sha256 of its library and how it was built."""

    id: str = Field(pattern=r"^[A-Za-z0-9_]{1,64}$")
    sha256: str = Field(pattern=SHA256_PATTERN)
    spec: dict[str, Any] = Field(description="kernelfleet.ukernel.UKernelSpec as a dict (N, K, mt, nt, kt, vec, ...)")
    size_bytes: int = Field(ge=0)


class ExactOverride(_Wire):
    """A per-shape config (from a `sketch` job) measured faster than the table's program at S."""

    S: int = Field(ge=1)
    latency_s: float
    table_latency_s: float | None = None
    config: dict[str, Any]


class DispatchDoc(_Wire):
    """A dispatch table as served by GET /v1/dispatch: the per-shape programs for a whole dynamic range."""

    workload_hash: str
    target_fingerprint: str
    dim: str = Field(description="the dynamic dimension the table ranges over")
    s_max: int = Field(description="the table's last tuned S; larger S extend its last interval")
    table: dict[str, Any] = Field(description="kernelfleet.dispatch.DispatchTable as a dict")
    ukernels: list[UKernelRef]
    predicted_latency_s: list[float] = Field(description="predicted seconds of the program for S = 1..s_max")
    measured_latency_s: dict[str, float] = Field(description="measured seconds of the program at validated S")
    overrides: list[ExactOverride] = Field(default_factory=list)
    validation: dict[str, Any] = Field(default_factory=dict)
    job_id: str | None = None
    created_at: dt.datetime


class KindInfo(_Wire):
    """A job kind this service runs (GET /v1/kinds)."""

    name: str
    summary: str
    target_kinds: list[str] = Field(description="the platforms it tunes on")
    publishes: str = Field(description="configs (best config per shape) or dispatch (a table for a whole range)")


class PlatformInfo(_Wire):
    """A hardware platform this service knows (GET /v1/platforms)."""

    name: str
    summary: str


class ModelOpView(_Wire):
    """One op of a model: its workload, its budget share and its job (none when the op was skipped, with why)."""

    name: str
    op: str
    workload_hash: str
    occurrences: int
    dims: dict[str, int | str] = Field(default_factory=dict, description="provenance: expressions of the inputs")
    priority: float = Field(description="expected FLOPs per call (the distribution's weights) × occurrences")
    share: float = Field(description="the op's share of the model's priority")
    trials: int = Field(description="the job's budget: the floor plus its share of the rest")
    skipped: str | None = Field(default=None, description="why the op was not tuned (the kind cannot on the target)")
    job_id: str | None = None
    state: str | None = None
    progress: float = 0.0
    trials_done: int = 0
    trials_total: int = 0
    error: str | None = None


class ModelView(_Wire):
    """A model onboarded in one request: its ops' jobs and their progress, aggregated."""

    id: str
    name: str
    kind: str
    target: dict[str, Any]
    state: str = Field(description="queued, running, or once every job ended: succeeded, failed or cancelled")
    progress: float = Field(ge=0, le=1, description="trials done over trials planned, over every job")
    jobs_total: int
    jobs_done: int = Field(description="jobs that ended (succeeded, failed or cancelled)")
    states: dict[str, int] = Field(description="jobs per state")
    trials_done: int
    trials_total: int
    budget: dict[str, Any] = Field(default_factory=dict)
    budget_split: dict[str, Any] = Field(default_factory=dict, description="how the budget was split, and the rule")
    tags: dict[str, str] = Field(default_factory=dict)
    ops: list[ModelOpView] = Field(default_factory=list)
    created_at: dt.datetime

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def job_ids(self) -> list[str]:
        return [op.job_id for op in self.ops if op.job_id]

    @property
    def skipped(self) -> list[ModelOpView]:
        return [op for op in self.ops if op.skipped]


class ModelList(_Wire):
    models: list[ModelView]
    total: int


# Names the SDK has always exported.
Job = JobView
BestConfig = ConfigRecord
Model = ModelView
