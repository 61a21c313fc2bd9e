"""Dispatch tables: the per-shape programs a `ukernel` job publishes for a whole dynamic range.

An inference host fetches one `DispatchDoc` per (workload, target fingerprint) and the uKernel
artifacts it names, then picks a program for any S locally (kernelfleet.dispatcher).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, Field

SHA256_PATTERN = r"^[0-9a-f]{64}$"


class UKernelRef(BaseModel):
    """One compiled uKernel: its id in the table, the sha256 of its library and how it was built."""

    id: str = Field(pattern=r"^[A-Za-z0-9_]{1,64}$")
    sha256: str = Field(pattern=SHA256_PATTERN)
    spec: dict[str, Any] = Field(description="kernelfleet.ukernel.UKernelSpec as a dict (N, K, mt, nt, kt, vec, ...)")
    size_bytes: int = Field(ge=0)


class ExactOverride(BaseModel):
    """A per-shape config (from a `sketch` job) measured faster than the table's program at S."""

    S: int = Field(ge=1)
    latency_s: float
    table_latency_s: float | None
    config: dict[str, Any]


class DispatchDoc(BaseModel):
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
