"""When a timed shape keeps its uKernels and which vendor library runs it otherwise: decisions on paired samples.

A single timing decided a route before (issue 31): one fast numpy reading at M=431 sent M = 397..455 to numpy,
which runs there at 0.54× of PyTorch. Now a shape is timed in paired rounds, and the rule is one-sided, because
a host loses more from a uKernel that is slower than its library than it gains from one a few percent faster:

  - a round times our program and every vendor library in alternation (each a median of several calls, after
    the previous library's threads are asleep), so slow phases of a shared machine hit all sides of a round;
  - the vendor library at S is the one with the least median over the rounds (a median: one outlier round,
    fast or slow, cannot choose it);
  - our program keeps S only if it beat that library in enough rounds that "equally fast" is unlikely (a
    one-sided sign test: under "equally fast" each round is a coin flip; p ≤ ALPHA = 0.05 needs 5 wins of 5,
    or 7 of 8, so one bad round out of eight is tolerated) and its median ratio (ours / library, per round) is
    at most 1 - UKERNEL_MARGIN: a win worth a route, not one within noise. Anything else goes to the library;
  - sequential: MIN_ROUNDS rounds first; a shape goes on to more rounds (up to MAX_ROUNDS) only while its median
    says "win" and winning every remaining round could still pass the test (a clear loss costs no more rounds).

`vendor_routes.decide` then confirms every route boundary and isolated decision with more rounds (`merged`).
Every sample behind a decision goes into the published record (`to_dict`) and the job's dashboard page.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

UKERNEL_MARGIN = 0.05  # our program must be at least 5 % faster than the library (median of the rounds)
MIN_ROUNDS = 3
CONFIRM_ROUNDS = 5  # the fewest rounds that can pass the sign test at ALPHA (5 wins of 5: p = 1/32)
MAX_ROUNDS = 8  # where sequential timing stops (7 wins of 8: p = 9/256)
ALPHA = 0.05


def sign_test_p(wins: int, rounds: int) -> float:
    """P(at least `wins` wins of `rounds` | each round a fair coin): the one-sided sign test's p-value."""
    p: float = sum(math.comb(rounds, k) for k in range(wins, rounds + 1)) / 2**rounds
    return p


UKERNEL = "ukernel"  # the route key of a shape our program keeps


@dataclass(frozen=True)
class PointTiming:
    """Per-round medians (seconds per call) of our program and of each vendor library at one shape, round i of
    each side timed in the same round."""

    ours: tuple[float, ...]
    libraries: Mapping[str, tuple[float, ...]]

    def __post_init__(self) -> None:
        if not self.ours or not self.libraries:
            raise ValueError("a point timing needs at least one round of our program and of one library")
        if any(len(times) != len(self.ours) for times in self.libraries.values()):
            raise ValueError("every side of a point timing needs the same rounds")

    @classmethod
    def single(cls, ours: float, vendor: float, library: str = "vendor") -> PointTiming:
        """One round: what a caller that times once hands over (tests, synthetic curves)."""
        return cls((ours,), {library: (vendor,)})

    def merged(self, more: PointTiming) -> PointTiming:
        """These rounds and `more`'s, pooled (a confirmation's extra rounds)."""
        if set(more.libraries) != set(self.libraries):
            raise ValueError("cannot pool timings of different libraries")
        return PointTiming(
            self.ours + more.ours, {lib: times + more.libraries[lib] for lib, times in self.libraries.items()}
        )

    @property
    def rounds(self) -> int:
        return len(self.ours)

    @property
    def library(self) -> str:
        """The vendor library with the least median over the rounds (the lower name on a tie)."""
        return min(sorted(self.libraries), key=lambda lib: statistics.median(self.libraries[lib]))

    @property
    def ours_s(self) -> float:
        return statistics.median(self.ours)

    @property
    def vendor_s(self) -> float:
        return statistics.median(self.libraries[self.library])

    @property
    def ratios(self) -> tuple[float, ...]:
        """Ours / the chosen library, round by round."""
        return tuple(o / max(v, 1e-30) for o, v in zip(self.ours, self.libraries[self.library], strict=True))

    @property
    def wins(self) -> int:
        """Rounds in which our program beat the chosen library."""
        return sum(r < 1.0 for r in self.ratios)

    def _median_wins(self) -> bool:
        return statistics.median(self.ratios) <= 1.0 - UKERNEL_MARGIN

    @property
    def needs_more_rounds(self) -> bool:
        """Not confirmed yet, but the median says "win" and winning every round up to MAX_ROUNDS would confirm it."""
        if self.rounds >= MAX_ROUNDS or self.ukernel_wins or not self._median_wins():
            return False
        return sign_test_p(self.wins + MAX_ROUNDS - self.rounds, MAX_ROUNDS) <= ALPHA

    @property
    def ukernel_wins(self) -> bool:
        """Whether our program keeps this shape: the sign test over its rounds at ALPHA, and the median margin.
        A single-round timing (`single`) is the caller's own verdict: ours wins when faster at all."""
        if self.rounds == 1:
            return self.ours[0] < self.vendor_s
        return self._median_wins() and sign_test_p(self.wins, self.rounds) <= ALPHA

    @property
    def vendor_won(self) -> bool:
        return not self.ukernel_wins

    @property
    def route(self) -> str:
        """UKERNEL, or the library that runs this shape."""
        return UKERNEL if self.ukernel_wins else self.library

    def medians(self) -> dict[str, float]:
        """Each side's median seconds: UKERNEL's and each library's."""
        return {UKERNEL: self.ours_s, **{lib: statistics.median(t) for lib, t in self.libraries.items()}}

    def to_dict(self) -> dict[str, Any]:
        """The samples behind the decision and the decision, for the published record and the dashboard."""
        return {
            "route": self.route,
            "rounds": self.rounds,
            "wins": self.wins,
            "sign_test_p": sign_test_p(self.wins, self.rounds),
            "ratio_median": statistics.median(self.ratios),
            "ratio_range": [min(self.ratios), max(self.ratios)],
            "samples_s": {UKERNEL: list(self.ours), **{lib: list(t) for lib, t in self.libraries.items()}},
        }


def describe_rule() -> str:
    """The rule in one line, as the record and the dashboard state it."""
    return (
        f"uKernels keep a shape only if faster than the fastest library in enough paired rounds (one-sided sign test, "
        f"p <= {ALPHA}: 5 of 5, 7 of 8) and by >= {UKERNEL_MARGIN:.0%} in the median round; the library is the one "
        "with the least median; "
        "route boundaries and isolated decisions are re-timed and decided on the pooled rounds"
    )
