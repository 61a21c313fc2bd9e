"""What a job tunes: its shape rows, planned once from the distribution (the API and the worker plan alike)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlannedShape:
    """One shape row of a job: its share of the traffic, its priority (FLOPs × weight) and its trials."""

    shape: dict[str, int]
    weight: float
    priority: float
    trials: int
