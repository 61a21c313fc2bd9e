"""bench/pipeline_gpu.py's like-for-like rules on a CPU host: equal budget, and finalists re-timed on one timer,
interleaved, with a wrong finalist dropped rather than reported."""

from __future__ import annotations

from typing import Any

import pytest

from tests.bench.modules import load

pipe = load("pipeline_gpu")


class FakeRunner:
    """Stands in for Runner: seconds per module from a table, every call recorded."""

    def __init__(self, seconds: dict[str, list[float]], wrong: frozenset[str] = frozenset()) -> None:
        self.seconds_left = {name: list(v) for name, v in seconds.items()}
        self.wrong = wrong
        self.calls: list[tuple[str, bool]] = []

    def seconds(self, module: Any, check: bool = True) -> float:
        self.calls.append((module, check))
        if check and module in self.wrong:
            raise ValueError("wrong result")
        return self.seconds_left[module].pop(0)


def test_finalists_are_retimed_interleaved_on_one_timer() -> None:
    runner = FakeRunner({"pipelined": [3.0, 1.0, 2.0], "metaschedule": [5.0, 4.0, 6.0]})
    times, errors = pipe.final_times({"pipelined": "pipelined", "metaschedule": "metaschedule"}, runner)
    assert times == {"pipelined": 2.0, "metaschedule": 5.0} and errors == {}  # medians, not minima
    assert [name for name, _ in runner.calls] == ["pipelined", "metaschedule"] * 3
    assert [check for _, check in runner.calls] == [True, True, False, False, False, False]


def test_a_wrong_finalist_is_dropped_and_named() -> None:
    runner = FakeRunner({"pipelined": [1.0, 1.0, 1.0], "metaschedule": []}, wrong=frozenset({"metaschedule"}))
    times, errors = pipe.final_times({"pipelined": "pipelined", "metaschedule": "metaschedule"}, runner)
    assert times == {"pipelined": 1.0} and "wrong result" in errors["metaschedule"]


@pytest.mark.parametrize(
    ("pipeline", "ms", "equal"),
    [(32, 32, True), (32, 30, True), (32, 12, False), (40, 40, False), (32, None, False)],
)
def test_equal_budget(pipeline: int, ms: int | None, equal: bool) -> None:
    assert pipe.equal_budget(32, pipeline, ms) is equal
