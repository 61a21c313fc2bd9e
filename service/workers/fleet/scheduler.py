"""Split a daily trial budget across tuning tasks with the gradient task-scheduler rule.

Ansor's task scheduler, as GTCO and BACO use it (../shared/research/thesis.md §1.4, §4.6): warm up with
one unit per task, then repeatedly give the next unit to the task whose objective falls the most
for it, and stop spending on tasks whose gradient has stalled. Here the objective is the fleet's
time per day, a task's expected saving after t units is E·(1 − e^(−t/τ)) (diminishing returns of
search), and a task whose kind covers everything in one job (e.g. `ukernel`) saturates after one unit.
Tasks marked stalled by history (the last fleet job for them changed nothing) get nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

TAU_UNITS = 2.0  # units over which a search task gets ~63% of its expected saving
MIN_GRADIENT_SHARE = 0.01  # a unit must buy ≥ 1% of the tasks' total expected saving, or spending stops


@dataclass(frozen=True)
class Task:
    key: str
    expected_saving: float  # seconds of fleet time per day, if fully tuned
    saturates_after: int | None = None  # units after which more buys nothing (1 for a one-job kind)
    stalled: bool = False


def saving(task: Task, units: int) -> float:
    if task.saturates_after is not None:
        return task.expected_saving * min(units, task.saturates_after) / task.saturates_after
    return task.expected_saving * (1.0 - math.exp(-units / TAU_UNITS))


def gradient(task: Task, units: int) -> float:
    return saving(task, units + 1) - saving(task, units)


def allocate(tasks: Sequence[Task], budget_units: int) -> dict[str, int]:
    """Units per task key (tasks given none are absent). Deterministic: ties go to the earlier task."""
    live = [t for t in tasks if not t.stalled and t.expected_saving > 0]
    units = {t.key: 0 for t in live}
    left = budget_units
    for t in sorted(live, key=lambda t: -t.expected_saving):  # warm-up, most promising first
        if left == 0:
            break
        units[t.key], left = 1, left - 1
    floor = MIN_GRADIENT_SHARE * sum(t.expected_saving for t in live)
    while left > 0 and live:
        best = max(live, key=lambda t: gradient(t, units[t.key]))
        if gradient(best, units[best.key]) < floor or gradient(best, units[best.key]) <= 0:
            break  # every task's gain has stalled: keep the rest of the budget
        units[best.key] += 1
        left -= 1
    return {k: v for k, v in units.items() if v > 0}
