"""Fleet telemetry, usage, daily tuning runs and their reports."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from service.models.fields import Day, HexId, Int, Key, Real, Shape, Text

MAX_RECORDS_PER_BATCH = 10_000

Reason = Literal["untuned", "fallback", "older-toolchain", "drift"]


class HoldoutSample(BaseModel):
    """Both sides of a host's A/B holdout at one shape (kernelfleet.holdout): the calls it served, and the calls it
    held out to run its baseline (what it would run without KernelFleet), with their seconds and squared seconds."""

    model_config = ConfigDict(extra="forbid")

    baseline: Key = Field(description="what the held-out calls ran, e.g. 'torch' (the layer's PyTorch computation)")
    served_calls: Annotated[Int, Field(ge=0, le=10**12)]
    served_s: Annotated[Real, Field(ge=0, le=1e12)]
    served_s2: Annotated[Real, Field(ge=0, le=1e12)]
    baseline_calls: Annotated[Int, Field(ge=0, le=10**12)]
    baseline_s: Annotated[Real, Field(ge=0, le=1e12)]
    baseline_s2: Annotated[Real, Field(ge=0, le=1e12)]


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
    table_job_id: Key | None = Field(default=None, description="the job whose dispatch table served these calls")
    holdout: HoldoutSample | None = Field(default=None, description="the A/B holdout's sums at this shape, if any")

    @model_validator(mode="after")
    def _holdout_within_calls(self) -> TelemetryRecord:
        if self.holdout is not None and self.holdout.served_calls + self.holdout.baseline_calls > self.calls:
            raise ValueError("holdout: served_calls + baseline_calls exceed the record's calls")
        return self


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
    units: int = Field(0, description="scheduler units the budget gave it")
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


class TaskSaving(BaseModel):
    """One (workload, target)'s saving, measured by its hosts' A/B holdout at the shapes with samples on both sides."""

    workload_hash: str
    target_fingerprint: str
    label: str = ""
    shapes: int
    baseline_s_per_day: float = Field(description="its served volume at those shapes, timed as the baseline")
    served_s_per_day: float = Field(description="the same volume, timed as served")
    saved_s_per_day: float
    ci95_s_per_day: float = Field(description="half-width of the 95 % interval of saved_s_per_day")


class MeasuredSaving(BaseModel):
    """Fleet seconds saved per day over some days, from the hosts' A/B holdout: what was served against what the
    hosts run without KernelFleet, interleaved on the same hosts (service.workers.fleet.savings)."""

    since: dt.date
    until: dt.date
    days: int = Field(description="days with telemetry: the per-day figures divide by it")
    fleet_s_per_day: float
    measured_share: float = Field(description="share of the fleet's time at shapes with A/B samples on both sides")
    served_calls: int = Field(description="calls served at those shapes (volume the saving counts)")
    holdout_calls: int = Field(description="calls the hosts held out to run their baseline")
    saved_s_per_day: float
    ci95_s_per_day: float = Field(description="half-width of the 95 % interval of saved_s_per_day")
    speedup: float | None = Field(None, description="baseline time ÷ served time over the measured volume")
    tasks: list[TaskSaving] = Field(default_factory=list)


class Rollback(BaseModel):
    """A published table the daily run retired: slower, on production telemetry, than the baseline the hosts held
    out or than the table it replaced, beyond the 95 % interval and the margin (fleet_rollback_margin)."""

    workload_hash: str
    target_fingerprint: str
    label: str = ""
    table_job_id: str = Field(description="the job that published the table rolled back")
    against: Literal["baseline", "previous table"]
    other_job_id: str | None = Field(None, description="the previous table's job, when compared against it")
    served_s: float = Field(
        description="the table's mean seconds a call over the compared shapes, weighted by its own served calls there"
    )
    other_s: float = Field(
        description="the baseline's mean seconds for the same mix, or the previous table's (its ratio to its own "
        "days' baseline, at the speed the baseline ran in this window)"
    )
    slowdown_s: float = Field(description="served_s − other_s, seconds a call; ± ci95_s")
    ci95_s: float
    shapes: int
    now_serving: str | None = Field(description="the job whose table hosts get now; None: no table (the baseline)")


class FleetReport(BaseModel):
    day: dt.date
    state: Literal["running", "done", "failed"]
    created_at: dt.datetime
    finished_at: dt.datetime | None = None
    window_days: int = 0
    observed_days: int = Field(0, description="days of the window with telemetry: the per-day figures divide by it")
    fleet_seconds_per_day: float = 0.0
    budget: dict[str, int] = Field(
        default_factory=dict,
        description="trials per hardware class (the smaller of "
        "the trial budget and the worker-second budget's units, in trials)",
    )
    spent: dict[str, int] = Field(default_factory=dict, description="trials the submitted jobs were given")
    budget_s: dict[str, float] = Field(default_factory=dict, description="worker seconds per hardware class")
    unit_s: dict[str, float] = Field(default_factory=dict, description="worker seconds per unit, from earlier jobs")
    planned_s: dict[str, float] = Field(default_factory=dict, description="units given × unit_s: the plan's time")
    candidates: list[FleetCandidate] = Field(default_factory=list)
    expected_saving_s_per_day: float = 0.0
    measured: MeasuredSaving | None = Field(
        None, description="the window's saving from the hosts' A/B holdout, with its 95 % interval"
    )
    cost: dict[str, Any] = Field(
        default_factory=dict, description="worker seconds of every earlier fleet job (failed, superseded ... too)"
    )
    savings_per_tuning_s: list[float] | None = Field(
        None, description="measured saving per day ÷ the tuning seconds: [low, estimate, high] from the interval"
    )
    modelled: dict[str, Any] = Field(
        default_factory=dict,
        description="a model, not a measurement: the newest jobs' speedup (timed in the worker) × the fleet time",
    )
    rollbacks: list[Rollback] = Field(default_factory=list, description="tables this run retired, and why")
    regressions: list[Regression] = Field(default_factory=list)
    remeasured: int = 0
    silent: list[SilentTask] = Field(
        default_factory=list, description="tasks without telemetry for fleet_silent_after_days (90 days looked back)"
    )
    error: str | None = None


class FleetRunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    day: Day | None = Field(default=None, description="the UTC day to run for (not after today); default today")
