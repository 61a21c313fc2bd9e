"""A JobSink for running a kind's units in-process: keeps the candidates, never stops, resumes nothing."""

from __future__ import annotations

from service.models.config import MeasuredCandidate


class RecordingSink:
    def __init__(self) -> None:
        self.candidates: list[MeasuredCandidate] = []

    def on_candidates(self, unit_key: str, candidates: list[MeasuredCandidate]) -> None:
        self.candidates += candidates

    def on_progress(self, shape_key: str | None, trials: int) -> None:
        pass

    def earlier_candidates(self, unit_key: str) -> list[MeasuredCandidate]:
        return []

    def should_stop(self) -> bool:
        return False
