"""The one interface every tuner implements (as MetaSchedule's `builder/` declares `Builder` beside its
implementations): a tuner gets its own typed task, reports what it measures to its own typed sink while it
runs, and returns its own typed outcome. Each tuner's task, sink and outcome live beside it; `registry` names
them all.

Tuners know nothing of Celery, HTTP or the store: the job kinds (service.tuning.kinds) adapt a job's unit to
a task and a sink, and the benchmarks call the same `tune`.
"""

from __future__ import annotations

from typing import Protocol, TypeVar, runtime_checkable


class TuningStopped(Exception):
    """Raised inside a tuner when its sink asks it to stop (cancelled job, lost lease)."""


class StopSignal(Protocol):
    """What every sink answers: whether the job still wants the run (a cancelled job or a lost lease does not)."""

    def should_stop(self) -> bool: ...


TaskT_contra = TypeVar("TaskT_contra", contravariant=True)
SinkT_contra = TypeVar("SinkT_contra", bound=StopSignal, contravariant=True)
OutcomeT_co = TypeVar("OutcomeT_co", covariant=True)


@runtime_checkable
class Tuner(Protocol[TaskT_contra, SinkT_contra, OutcomeT_co]):
    """`name` is the tuner's key in `registry.TUNERS`."""

    name: str

    def tune(self, task: TaskT_contra, sink: SinkT_contra) -> OutcomeT_co: ...
