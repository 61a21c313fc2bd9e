"""The in-model check shared by a table's layers (kernelfleet.in_model_check): samples pooled across layers, and an S
between two clearly decided ones taken from them only where nothing says otherwise."""

from __future__ import annotations

import pytest

from kernelfleet.dispatch import DispatchTable, Interval, Shape
from kernelfleet.in_model_check import IN_MODEL_CALLS, PYTORCH, TABLE, InModelCheck, Verdict

ONE_UKERNEL = DispatchTable((Interval(1, 64, Shape((), "u4")),), {"u4": 4})
TWO_UKERNELS = DispatchTable((Interval(1, 9, Shape((), "u4")), Interval(10, 64, Shape((), "u8"))), {"u4": 4, "u8": 8})
# S 10..64 routed to PyTorch: checked on the uKernel of 1..9, the nearest interval's
ROUTED_ABOVE_9 = DispatchTable((Interval(1, 9, Shape((), "u4")), Interval(10, 64, None, "torch")), {"u4": 4})


def _checked(check: InModelCheck, S: int, ukernels_s: float, pytorch_s: float) -> Verdict:
    """S checked to its verdict, the samples alternating as the layers' calls give them."""
    verdict = None
    while verdict is None:
        side = check.next_side(S)
        verdict = check.add(S, side, ukernels_s if side == TABLE else pytorch_s)
    return verdict


def test_samples_from_any_layer_settle_s_once_for_all() -> None:
    check = InModelCheck(ONE_UKERNEL)
    assert check.verdict(8) is None  # nothing known: checked
    sides = [check.next_side(8) for _ in range(2)]
    assert sides == [TABLE, TABLE]  # (no sample added yet: the uKernels go first)
    for i in range(2 * IN_MODEL_CALLS - 1):  # e.g. four layers in two forwards, less one call
        side = check.next_side(8)
        assert check.add(8, side, 1.0 if side == TABLE else 2.0) is None
        assert side == (TABLE if i % 2 == 0 else PYTORCH)
    assert check.add(8, check.next_side(8), 2.0) == Verdict(TABLE, 1.0, 2.0)
    assert check.verdict(8) == Verdict(TABLE, 1.0, 2.0) and 8 not in check.trials


@pytest.mark.parametrize(
    ("table", "lo", "hi", "at", "expected"),
    [
        (ONE_UKERNEL, (1.0, 2.0), (1.0, 2.0), 10, TABLE),  # both clear wins of the uKernels
        (ONE_UKERNEL, (2.0, 1.0), (2.0, 1.0), 10, PYTORCH),  # both clear wins of PyTorch
        (ONE_UKERNEL, (1.0, 2.0), (2.0, 1.0), 10, None),  # they disagree
        (ONE_UKERNEL, (1.0, 1.1), (1.0, 2.0), 10, None),  # one won narrowly
        (ONE_UKERNEL, (1.0, 2.0), (1.0, 2.0), 13, None),  # outside the pair
        (TWO_UKERNELS, (1.0, 2.0), (1.0, 2.0), 10, None),  # 10 runs another uKernel than 8
        (ROUTED_ABOVE_9, (1.0, 2.0), (1.0, 2.0), 10, TABLE),  # routed S are checked on the same uKernel as 8
        (ROUTED_ABOVE_9, (2.0, 1.0), (2.0, 1.0), 11, PYTORCH),
    ],
)
def test_an_s_between_two_clear_verdicts_alike_takes_theirs(
    table: DispatchTable, lo: tuple[float, float], hi: tuple[float, float], at: int, expected: str | None
) -> None:
    check = InModelCheck(table)
    _checked(check, 8, *lo)
    _checked(check, 12, *hi)
    verdict = check.verdict(at)
    assert (verdict.route if verdict else None) == expected
    if verdict is not None:
        assert verdict.between == (8, 12) and verdict.ukernels_s is None and verdict.clear_route is None
        assert check.verdict(at) is verdict  # remembered


def test_checked_s_too_far_apart_or_no_table_say_nothing_of_the_s_between() -> None:
    wide = InModelCheck(ONE_UKERNEL)
    _checked(wide, 8, 1.0, 2.0)
    _checked(wide, 20, 1.0, 2.0)  # 2.5x apart
    assert wide.verdict(12) is None
    untabled = InModelCheck(None)
    _checked(untabled, 8, 1.0, 2.0)
    _checked(untabled, 12, 1.0, 2.0)
    assert untabled.verdict(10) is None
    taken = InModelCheck(ONE_UKERNEL)
    _checked(taken, 8, 1.0, 2.0)
    _checked(taken, 12, 1.0, 2.0)
    assert taken.verdict(10) is not None and taken.verdict(11) is not None
    taken.next_side(9)  # 9 is being checked: its own samples decide it
    assert taken.verdict(9) is None
