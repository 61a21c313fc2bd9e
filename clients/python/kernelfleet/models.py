"""Response types of the SDK (the wire format of the service's /v1 API)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class ShapeResult(_Wire):
    shape: dict[str, int]
    weight: float
    trials: int
    trials_done: int
    state: str
    best_latency_s: float | None = None
    baseline: str | None = None
    baseline_latency_s: float | None = None

    @property
    def speedup(self) -> float | None:
        if self.best_latency_s and self.baseline_latency_s:
            return self.baseline_latency_s / self.best_latency_s
        return None


class Job(_Wire):
    id: str
    kind: str
    state: str
    workload_hash: str
    target: dict[str, Any]
    target_fingerprint: str | None
    progress: float
    trials_done: int
    trials_total: int
    error: str | None
    attempts: int
    created_at: dt.datetime
    finished_at: dt.datetime | None = None
    shapes: list[ShapeResult] = []

    @property
    def done(self) -> bool:
        return self.state in ("succeeded", "failed", "cancelled")


class BestConfig(_Wire):
    workload_hash: str
    target_fingerprint: str
    shape: dict[str, int]
    latency_s: float
    kind: str
    config: dict[str, Any]
    provenance: dict[str, Any] = {}
    job_id: str | None = None


class Workload(_Wire):
    workload_hash: str
    op: str
    dtype: str = "float32"
    dims: dict[str, int]
    symbolic: list[str]
    attrs: dict[str, int | bool] = {}


class Target(_Wire):
    target_fingerprint: str
    kind: str
    toolchain: dict[str, str] | None = None


class UKernelRef(_Wire):
    id: str
    sha256: str
    spec: dict[str, Any]
    size_bytes: int
    signature: str | None = None


class ExactOverride(_Wire):
    S: int
    latency_s: float
    table_latency_s: float | None = None
    config: dict[str, Any]


class DispatchDoc(_Wire):
    """A dispatch table as served by GET /v1/dispatch."""

    workload_hash: str
    target_fingerprint: str
    dim: str
    s_max: int
    table: dict[str, Any]
    ukernels: list[UKernelRef]
    predicted_latency_s: list[float]
    measured_latency_s: dict[str, float]
    overrides: list[ExactOverride] = []
    validation: dict[str, Any] = {}
    job_id: str | None = None
    created_at: dt.datetime
