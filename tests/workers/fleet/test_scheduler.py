"""The gradient task scheduler: warm-up, largest gradient first, saturation, stalls, budget bounds."""

from __future__ import annotations

from service.workers.fleet.scheduler import Task, allocate, gradient, saving


def test_warm_up_then_largest_gradient_first_within_the_budget() -> None:
    tasks = [Task("a", 100.0), Task("b", 10.0), Task("c", 50.0, saturates_after=1)]
    units = allocate(tasks, 6)
    assert sum(units.values()) <= 6
    assert units["c"] == 1  # a ukernel task saturates after one unit
    assert units["a"] > units["b"] >= 1  # everyone warms up; the big search gets most of the rest
    # every unit went where it bought the most: no move of one unit between search tasks would gain
    assert gradient(tasks[0], units["a"] - 1) >= gradient(tasks[1], units["b"])


def test_stalled_tasks_get_nothing_and_spending_stops_when_gains_stall() -> None:
    units = allocate([Task("a", 100.0, stalled=True), Task("b", 5.0)], 10)
    assert "a" not in units and units["b"] >= 1
    # b alone: units stop once one more buys < 1% of the expected total
    assert saving(Task("b", 5.0), units["b"]) <= 5.0
    assert gradient(Task("b", 5.0), units["b"]) < 0.01 * 5.0 or units["b"] == 10
    assert allocate([Task("a", 0.0), Task("b", 3.0)], 0) == {}
    assert allocate([Task("x", 1.0, saturates_after=1)], 5) == {"x": 1}  # the rest of the budget is kept


def test_warm_up_goes_to_the_most_promising_when_units_are_scarce() -> None:
    assert allocate([Task("small", 1.0), Task("big", 9.0), Task("mid", 5.0)], 2) == {"big": 1, "mid": 1}
