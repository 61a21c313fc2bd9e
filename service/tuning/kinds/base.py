"""The `JobKind` interface: one tuning algorithm, driven by the job runner through a `Platform`.

A kind validates a job spec for itself (a 422 naming the field), plans the job's work from the shape
distribution (one unit per hot shape, or one unit for a whole range), tunes a unit through the
platform while reporting measured candidates to a sink, and returns what to publish: verified best
configs per shape, or a dispatch table with its artifacts. The runner owns everything else: the
lease, resuming, the store, publishing atomically while it holds the lease.

Kinds know nothing of Celery or HTTP. They are looked up by name (see `__init__`), so the runner, the
Celery task, the fleet loop, the demo and the CLI never name one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ValidationError

from kernelfleet.tables import TableVariant
from service.models import Budget, TargetSpec, Workload, WorkloadSpec
from service.models.artifact import Artifact
from service.models.config import MeasuredCandidate
from service.models.distribution import ShapeDistribution
from service.models.plan import PlannedShape
from service.settings import Settings
from service.tuning.platforms import Platform, VendorTiming


@dataclass(frozen=True)
class Problem:
    """Why a job spec does not fit a kind: `loc` is the field under the request body, e.g. ("workload",)."""

    loc: tuple[str | int, ...]
    message: str


@dataclass(frozen=True)
class WorkUnit:
    """One resumable piece of a job: it is done once every shape row it settles has finished."""

    key: str  # stable across attempts: a shape key ("M=61") or a range ("M=1..128")
    shape_keys: tuple[str, ...]
    trials: int


@dataclass(frozen=True)
class Plan:
    shapes: list[PlannedShape]  # the job's per-shape rows, as users see them
    units: list[WorkUnit]
    trials_total: int  # what the job's progress counts to, from start to end


class JobSink(Protocol):
    """Where a kind reports while it tunes a unit; backed by the store."""

    def on_candidates(self, unit_key: str, candidates: list[MeasuredCandidate]) -> None:
        """Record measured candidates (kept forever) and count them as progress."""

    def on_progress(self, shape_key: str | None, trials: int) -> None:
        """Count work that produced no candidate (e.g. a validation measurement) for a shape row or the job."""

    def earlier_candidates(self, unit_key: str) -> list[MeasuredCandidate]:
        """What earlier attempts of this job measured for the unit on this target: a retry resumes from it."""

    def target_candidates(self, config_format: str, limit: int) -> list[MeasuredCandidate]:
        """What any job measured on this target in configs of `config_format`, newest first (a model calibrates
        itself on the hardware from them)."""

    def should_stop(self) -> bool:
        """True once the job was cancelled or its lease lost: stop and raise TuningStopped."""


@dataclass
class UnitContext:
    job_id: str
    worker: str
    workload: Workload
    target: TargetSpec  # resolved by the platform: toolchain (and detected details) filled in
    platform: Platform
    distribution: ShapeDistribution
    budget: Budget
    settings: Settings
    work_dir: Path
    sink: JobSink
    tags: Mapping[str, str] = field(default_factory=dict)  # the job's tags, e.g. a kind's search option


@dataclass
class ShapeOutcome:
    """A shape row's result. `config` is what to publish as the shape's best config (None: nothing)."""

    shape: dict[str, int]
    error: str | None = None
    latency_s: float | None = None  # the tuned kernel, as an inference host calls it
    vendor: VendorTiming | None = None
    config: dict[str, Any] | None = None
    config_latency_s: float | None = None  # the record's latency (the tuner's own measurement)
    provenance: dict[str, Any] = field(default_factory=dict)
    not_published: str | None = None  # why a verified config is not served, e.g. the vendor is faster


@dataclass
class DispatchPublication:
    """A dispatch table covering a dynamic dimension, with the artifacts it names."""

    dim: str
    table: TableVariant
    artifacts: list[Artifact]
    predicted: list[float]
    measured: dict[int, float]
    validation: dict[str, Any]


@dataclass
class UnitResult:
    shapes: list[ShapeOutcome] = field(default_factory=list)
    dispatch: DispatchPublication | None = None
    fatal: str | None = None  # fails the whole job with this reason
    not_published: str | None = None  # why the unit's verified result (e.g. its dispatch table) is not served


class JobKind(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]
    target_kinds: ClassVar[frozenset[str]]  # the platforms it tunes on
    # the workload dtypes it tunes (admission refuses others, naming workload.dtype); bfloat16 is opt-in: numpy
    # has no bfloat16 BLAS, so a kind must compute its references and baselines some other way to take it
    dtypes: ClassVar[frozenset[str]] = frozenset({"float32", "float16"})
    publishes: ClassVar[Literal["configs", "dispatch"]]
    default_trials: ClassVar[int] = 64  # what `make demo` and friends ask for when the user names no budget
    # The fleet loop: where several kinds accept a task, the highest priority tunes it; a kind whose
    # one job covers everything saturates after that many scheduler units.
    fleet_priority: ClassVar[int] = 0
    saturates_after: ClassVar[int | None] = None

    def validate(
        self, workload: WorkloadSpec, distribution: ShapeDistribution, target: TargetSpec, budget: Budget
    ) -> Problem | None:
        """Why this kind cannot tune this job (beyond what every kind checks), or None."""
        return None

    def check_tags(self, tags: Mapping[str, str]) -> Problem | None:
        """Why the job's tags do not set this kind's options right (loc ("tags", <tag>)), or None. Tags are free
        text, except the few a kind reads as options (e.g. pipeline_search)."""
        return None

    # The schema of the configs this kind records (a pydantic model with a `format` Literal and its default):
    # configs imported from elsewhere (POST /v1/configs/import) are checked against the kind of their format.
    config_schema: ClassVar[type[BaseModel] | None] = None

    @classmethod
    def config_format(cls) -> str | None:
        if cls.config_schema is None:
            return None
        default = cls.config_schema.model_fields["format"].default
        return default if isinstance(default, str) else None

    def check_config(self, config: Mapping[str, Any]) -> Problem | None:
        """Why `config` is not a config of this kind (loc under the config, e.g. ("trace",)), or None."""
        if self.config_schema is None:
            return Problem(("format",), f"{self.name} jobs define no config format")
        try:
            self.config_schema.model_validate(config)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            return Problem(tuple(first["loc"]), first["msg"])
        return None

    @abstractmethod
    def plan(self, workload: WorkloadSpec, distribution: ShapeDistribution, budget: Budget) -> Plan:
        """The job's shape rows and work units (deterministic: the API and the worker plan alike)."""

    @abstractmethod
    def run_unit(self, unit: WorkUnit, ctx: UnitContext) -> UnitResult:
        """Tune one unit through `ctx.platform`; raise TuningStopped when `ctx.sink.should_stop()`."""

    # -- the fleet loop ----------------------------------------------------------------------------
    def fleet_trials(self, units: int, unit_trials: int) -> int:
        """The budget of a fleet job given `units` scheduler units."""
        return units * unit_trials

    def fleet_shapes(
        self, workload: WorkloadSpec, observed: Mapping[str, float], candidates: Mapping[str, float]
    ) -> dict[str, float]:
        """The distribution (shape key → weight) a fleet job tunes for `workload`, from what hosts ran and what
        ranked."""
        return dict(candidates)

    # -- describing results -------------------------------------------------------------------------
    def describe_config(self, config: Mapping[str, Any]) -> str:
        """One line saying what a config of this kind chose (what the search varied), for people reading a
        job's candidates (the dashboard's tables); pure, so the API process runs it without a compiler."""
        return summarize_config(config)


def summarize_config(config: Mapping[str, Any]) -> str:
    """Any config in one line: its scalar fields (the default description of a kind's configs)."""
    scalars = [f"{k}={v}" for k, v in config.items() if isinstance(v, str | int | float | bool) and k != "format"]
    text = ", ".join(scalars) or str(config.get("format", ""))
    return text[:160]


def unit_done(plan_rows: Sequence[Any], unit: WorkUnit) -> bool:
    """Whether an earlier attempt settled every shape row of `unit` (rows carry `shape_key` and `state`); a
    resumed job re-runs units with a failed or unfinished row."""
    states = {r.shape_key: r.state for r in plan_rows}
    return all(states.get(k) == "succeeded" for k in unit.shape_keys)
