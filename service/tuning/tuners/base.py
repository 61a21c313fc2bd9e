"""Small interfaces between a tuning job and the tuner that runs it.

Tuners know nothing of Celery, HTTP or the store: they get a `TuningTask`, report measured candidates
to a `CandidateSink`, and return a `TuneOutcome`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only: the GPU kernel path imports this module without pydantic
    from service.models import TargetSpec, WorkloadSpec
    from service.models.config import MeasuredCandidate


class TuningStopped(Exception):
    """Raised inside a tuner when its sink asks it to stop (cancelled job, lost lease)."""


@dataclass(frozen=True)
class TuningTask:
    workload: WorkloadSpec
    shape: dict[str, int]
    target: TargetSpec
    trials: int
    work_dir: Path
    seed: int | None = None
    measure_timeout_s: int = 30
    # What earlier attempts of the same job measured for this task: a retry counts them against `trials` and
    # searches on from them instead of starting over.
    resume_from: tuple[MeasuredCandidate, ...] = ()


@dataclass
class TuneOutcome:
    best_config: dict[str, Any] | None
    best_latency_s: float | None
    measured: int
    errors: int
    extra: dict[str, Any] = field(default_factory=dict)


class CandidateSink(Protocol):
    def on_candidates(self, candidates: list[MeasuredCandidate]) -> None: ...

    def should_stop(self) -> bool: ...


class Tuner(Protocol):
    name: str

    def tune(self, task: TuningTask, sink: CandidateSink) -> TuneOutcome: ...
