"""accelerate's in-model check, shared by the layers that run one table (issue 33: servers whose shapes vary).

A table's S runs on uKernels because the job timed them faster than PyTorch in isolation; inside a model the other
libraries' thread pools (and PyTorch's between layers) change that, so each S is timed where it runs before it is
kept: after the first call at S (packing, checks: not a sample) calls alternate between the uKernels and the layer's
PyTorch computation until each side has IN_MODEL_CALLS, and S stays on the uKernels only if their median is
IN_MODEL_MARGIN faster, else it goes to PyTorch. An S the table routes to PyTorch is checked the same way on the
uKernels of the interval nearest it (they are shape-generic): the job timed PyTorch there in isolation on all the
host's threads, and inside a forward that runs uKernels PyTorch gets one, so one noisy or misplaced timing in a job no
longer decides the S for good.

One check per table, not per layer. The layers of a model that share a workload (BERT's 48 768×768 projections, a
Llama stack's gate-up pairs) share its dispatcher and compute the same thing at the same S, so their calls are
samples of one question: pooled, a forward through 12 such layers settles S in one or two forwards instead of nine.

S between checked ones. A server whose lengths vary meets new S all the time, and each check runs half its calls
on PyTorch. A new S lying between two checked S at most NEIGHBOUR_SPAN apart (as a ratio) that both kept the same
route by NEIGHBOUR_MARGIN (medians), with the table running the same uKernel at all three, takes that route
without a check. Anything less clear (the routes differ, a narrow win, a wider gap, another uKernel) is checked.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field
from typing import Any

IN_MODEL_CALLS = 4  # calls per side
IN_MODEL_MARGIN = 0.03  # how much faster the uKernels must be to keep S
NEIGHBOUR_SPAN = 2.0  # two decided S at most this many times apart ...
NEIGHBOUR_MARGIN = 0.2  # ... both decided by this much (median ratio), six times the keeping margin
TABLE, PYTORCH = "table", "pytorch"


def clear_choice(choice: str, ours_s: float, theirs_s: float, ours: str) -> str | None:
    """`choice` where it won by NEIGHBOUR_MARGIN, else None: `ours_s` is the median of the side named `ours`,
    `theirs_s` the other side's (the layers' check and the whole-forward check share this rule)."""
    won, lost = (ours_s, theirs_s) if choice == ours else (theirs_s, ours_s)
    return choice if won * (1 + NEIGHBOUR_MARGIN) <= lost else None


def between_choice(lo: int, lo_choice: str | None, hi: int, hi_choice: str | None) -> str | None:
    """What a size between two checked ones, `lo` < `hi`, takes from them: the clear choice both made, where they
    are at most NEIGHBOUR_SPAN apart; else None (it is checked on its own)."""
    if lo_choice is not None and lo_choice == hi_choice and lo > 0 and hi <= NEIGHBOUR_SPAN * lo:
        return lo_choice
    return None


@dataclass(frozen=True)
class Verdict:
    """Where S runs, on which medians (seconds: the uKernels', PyTorch's; None where taken from neighbours)."""

    route: str
    ukernels_s: float | None = None
    pytorch_s: float | None = None
    between: tuple[int, int] | None = None  # the checked S it was taken from

    @property
    def clear_route(self) -> str | None:
        """The route where it was checked and won by NEIGHBOUR_MARGIN either way, else None."""
        if self.ukernels_s is None or self.pytorch_s is None:
            return None
        return clear_choice(self.route, self.ukernels_s, self.pytorch_s, TABLE)


@dataclass
class InModelCheck:
    """The check of one table's S across every layer that runs it (`table`: theirs, to tell which uKernels run an
    S: an S between checked ones is taken from them only where all three run the same)."""

    table: Any = None  # the layers' DispatchTable (kernelfleet.dispatch), or None
    trials: dict[int, tuple[list[float], list[float]]] = field(default_factory=dict)  # S → (uKernels, PyTorch)
    verdicts: dict[int, Verdict] = field(default_factory=dict)
    _checked: list[int] = field(default_factory=list)  # sorted S with a checked verdict

    def verdict(self, S: int) -> Verdict | None:
        """S's verdict, taken from its neighbours when they allow it (then remembered), else None (check S)."""
        found = self.verdicts.get(S)
        if found is None and S not in self.trials:
            found = self._from_neighbours(S)
            if found is not None:
                self.verdicts[S] = found
        return found

    def next_side(self, S: int) -> str:
        """The side the next call at S runs while S is checked (the one with fewer samples; the uKernels first)."""
        table_s, torch_s = self.trials.setdefault(S, ([], []))
        return TABLE if len(table_s) <= len(torch_s) else PYTORCH

    def add(self, S: int, side: str, seconds: float) -> Verdict | None:
        """One timed call at S; its verdict once both sides have IN_MODEL_CALLS samples."""
        table_s, torch_s = self.trials.setdefault(S, ([], []))
        (table_s if side == TABLE else torch_s).append(seconds)
        if min(len(table_s), len(torch_s)) < IN_MODEL_CALLS:
            return None
        ours, theirs = statistics.median(table_s), statistics.median(torch_s)
        verdict = Verdict(TABLE if ours * (1 + IN_MODEL_MARGIN) < theirs else PYTORCH, ours, theirs)
        self.verdicts[S] = verdict
        bisect.insort(self._checked, S)
        del self.trials[S]
        return verdict

    def _ukernels(self, S: int) -> Any:
        """What the check runs at S on the uKernels (its interval's uKernel shape; at a vendor-routed S, the nearest
        interval's), None where there is none."""
        try:
            return self.table.interval(S).shape or self.table.nearest_shape(S)
        except KeyError:
            return None

    def _from_neighbours(self, S: int) -> Verdict | None:
        i = bisect.bisect_left(self._checked, S)
        if i == 0 or i == len(self._checked):
            return None
        lo, hi = self._checked[i - 1], self._checked[i]
        route = between_choice(lo, self.verdicts[lo].clear_route, hi, self.verdicts[hi].clear_route)
        if route is None or self.table is None:
            return None
        runs = self._ukernels(S)
        if runs is None or not self._ukernels(lo) == runs == self._ukernels(hi):
            return None
        return Verdict(route, between=(lo, hi))
