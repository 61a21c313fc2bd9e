"""Fleet telemetry, usage, daily tuning runs and their reports."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.models.fields import Day, HexId, Int, Real, Shape, Text

MAX_RECORDS_PER_BATCH = 10_000

Reason = Literal["untuned", "fallback", "older-toolchain", "drift"]


class TelemetryRecord(BaseModel):
    """What one inference host ran for one (workload, target, concrete shape) since its last report."""

    model_config = ConfigDict(extra="forbid")

    workload_hash: HexId
    target_fingerprint: HexId
    shape: Shape = Field(min_length=1)
    calls: Int = Field(ge=0, le=10**12)
    kernel_seconds: Real = Field(ge=0, le=1e9)
    fallbacks: Int = Field(default=0, ge=0, le=10**12, description="calls that ran the default kernel (a miss)")
    day: Day | None = Field(
        default=None, description="UTC day the calls happened, 2020-01-01 to tomorrow; default: the day received"
    )


class TelemetryBatch(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "batch_id": "0b5f3c1e-8f0e-4a59-9d7c-6a1f2b3c4d5e",
                    "host": "inference-17",
                    "records": [
                        {
                            "workload_hash": "52a36ef24bd6a82eab95d4c1f0e3a7b2",
                            "target_fingerprint": "9f1c0e2d3b4a59687766554433221100",
                            "shape": {"M": 61},
                            "calls": 1200,
                            "kernel_seconds": 0.81,
                            "fallbacks": 0,
                        }
                    ],
                }
            ]
        },
    )

    batch_id: uuid.UUID = Field(description="chosen by the sender; resending the same batch changes nothing")
    host: Text = ""
    records: list[TelemetryRecord] = Field(min_length=1, max_length=MAX_RECORDS_PER_BATCH)


class TelemetryAck(BaseModel):
    batch_id: uuid.UUID
    accepted: int
    duplicate: bool


class UsageRow(BaseModel):
    workload_hash: str
    target_fingerprint: str
    label: str = Field("", description="the workload as people read it (empty: not registered here)")
    shape: dict[str, int]
    calls: int
    kernel_seconds: float
    fallbacks: int
    share: float = Field(description="share of the fleet's kernel time in the window")


class UsageView(BaseModel):
    since: dt.date
    until: dt.date
    total_seconds: float
    rows: list[UsageRow]


class FleetCandidate(BaseModel):
    """A tuning task the daily run considered: one workload on one target, and why."""

    workload_hash: str
    target_fingerprint: str
    label: str = Field("", description="the workload as people read it, e.g. 'dense M=? N=3072 K=768 +bias +gelu'")
    layers: list[str] = Field(
        default_factory=list, description="the onboarded models' ops on this workload, as 'model: op name'"
    )
    queue: str
    kind: str
    reasons: list[Reason]
    shapes: dict[str, float] = Field(description="shape key → observed kernel seconds per day")
    observed_s_per_day: float
    predicted_gain: float = Field(description="expected share of that time saved by tuning")
    expected_saving_s_per_day: float
    stalled: bool = False
    trials: int = 0
    job_id: str | None = None


class SilentTask(BaseModel):
    """A (workload, target) whose hosts stopped reporting: not re-tuned from stale telemetry; its tables stay served
    (the rule: the fleet run never retires a table; a host that calls it again is served at once)."""

    workload_hash: str
    target_fingerprint: str
    label: str = ""
    last_seen: dt.date
    days_silent: int
    published: bool = Field(description="the store serves a table or best configs for it")
    rule: Literal["kept"] = "kept"


class Regression(BaseModel):
    workload_hash: str
    target_fingerprint: str
    label: str = ""
    shape: str
    stored_s: float
    measured_s: float


class FleetReport(BaseModel):
    day: dt.date
    state: Literal["running", "done", "failed"]
    created_at: dt.datetime
    finished_at: dt.datetime | None = None
    window_days: int = 0
    observed_days: int = Field(0, description="days of the window with telemetry: the per-day figures divide by it")
    fleet_seconds_per_day: float = 0.0
    budget: dict[str, int] = Field(default_factory=dict, description="trials per hardware class")
    spent: dict[str, int] = Field(default_factory=dict)
    candidates: list[FleetCandidate] = Field(default_factory=list)
    expected_saving_s_per_day: float = 0.0
    realized: dict[str, Any] = Field(
        default_factory=dict, description="earlier runs' finished jobs: fleet time saved per day vs tuning seconds"
    )
    regressions: list[Regression] = Field(default_factory=list)
    remeasured: int = 0
    silent: list[SilentTask] = Field(
        default_factory=list, description="tasks without telemetry for fleet_silent_after_days (90 days looked back)"
    )
    error: str | None = None


class FleetRunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    day: Day | None = Field(default=None, description="the UTC day to run for (not after today); default today")
