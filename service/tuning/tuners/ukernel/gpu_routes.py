"""Which S of a GPU dense range go to cuBLAS: paired rounds of kernel-only times plus each side's host cost.

The GPU tuner used to route an S on ONE called-time sample of each side, taken one after the other, with no
margin (`vendor_routes.vendor_wins`); on an H100 that kept uKernels 3–8× slower than cuBLAS at single S where
one reading went the wrong way (../shared/research/gpu-first-light.md §4 item 7). Now:

  - **what is compared** at S is what a host pays per call: the kernel-only time (calls replayed from a CUDA
    graph: `CudaDispatcher.time_graph`, `cublas.time_linear`) plus that side's **host cost**, measured once per
    side before the sweep: called time (`time_called`, from Python, synchronised) minus graph time, at a few S
    (S = 1 and the first S of every interval of the tuned table, the different programs' host paths), the
    median of those samples, clamped at 0. Called and graph times are each medians of many calls; adding a
    host cost to every kernel is the un-overlapped case, pessimistic for the side whose host path is longer;
  - **paired rounds**: each round times both sides kernel-only, back to back, the side that goes first
    alternating from round to round, so a slow phase of the GPU or the host hits both sides of a round;
  - **the rule** is `route_stats`'s, the CPU one: the uKernels keep S only if they beat cuBLAS in enough rounds
    for a one-sided sign test (p ≤ 0.05: 5 of 5, 7 of 8) and by ≥ 5 % in the median round; everything else goes
    to cuBLAS. A close win gets more rounds (sequential, 3 → 8), a clear loss stops at 3;
  - **where**: `vendor_routes.decide` over the sweep's S (`vendor_routes.vendor_sweep_shapes`: every S ≤ 256,
    the ends of every interval, the hot shapes, a stride beyond), crossings between swept S bisected; every S at
    a change of route, and so every S standing alone, is **re-timed** (3 more paired rounds) and decided on the
    pooled rounds (`decide`'s confirm);
  - **the record** (`GpuRouteDecision.record`, the job's `validation.vendor_routes`) keeps every round of every
    S (kernel-only and as compared), which side went first, both host costs with their samples, the rule and
    the re-timed S.

The timers are injected (`GpuTimers`), so the decision runs without a GPU (tests/tuning/ukernel/test_gpu_routes.py);
the GPU tuner hands in the dispatcher's and cuBLAS's (gpu_tuner._vendor_sweep). `replay_sweep` applies the rule
to a record of single samples (the older `sweep_s`), which it refuses to keep any uKernel on.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.dispatch import DispatchTable
from service.tuning.tuners.ukernel.route_stats import (
    CONFIRM_ROUNDS,
    MIN_ROUNDS,
    UKERNEL,
    UKERNEL_MARGIN,
    PointTiming,
    describe_rule,
    sign_test_p,
)
from service.tuning.tuners.ukernel.vendor_routes import VendorDecision, decide, vendor_wins

LIBRARY = "cuBLAS"  # the vendor side's name in every PointTiming and record
SIDES = (UKERNEL, LIBRARY)
ROUTED_ON = "kernel-only + host cost, paired rounds"
MODE = (
    "kernel-only (both replayed from CUDA graphs) plus each side's measured host cost, in paired rounds, "
    "by the route_stats rule (sign test and margin)"
)
VENDOR = "cuBLAS through torch F.linear"
HOST_SAMPLES = 5  # host-cost samples per side at least (their median is the host cost)
HOST_SHAPES = 8  # at most this many S to sample host costs at

Timer = Callable[[int], float]  # S → seconds per call


@dataclass(frozen=True)
class GpuTimers:
    """Seconds per call at S rows, each a median over many calls: kernel-only (CUDA graph) and as a host calls
    it (from Python, synchronised), for our dispatcher and for cuBLAS."""

    ours_graph: Timer
    cublas_graph: Timer
    ours_called: Timer
    cublas_called: Timer

    def graph(self, side: str) -> Timer:
        return self.ours_graph if side == UKERNEL else self.cublas_graph

    def called(self, side: str) -> Timer:
        return self.ours_called if side == UKERNEL else self.cublas_called


@dataclass(frozen=True)
class HostCost:
    """One side's host cost per call: called minus kernel-only time, sampled at `shapes` (pairwise)."""

    shapes: tuple[int, ...]
    called_s: tuple[float, ...]
    graph_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.shapes or not len(self.shapes) == len(self.called_s) == len(self.graph_s):
            raise ValueError("a host cost needs one called and one graph time per sampled S")

    @property
    def samples_s(self) -> tuple[float, ...]:
        return tuple(c - g for c, g in zip(self.called_s, self.graph_s, strict=True))

    @property
    def seconds(self) -> float:
        """The median sample, clamped at 0 (a graph replay cannot cost more than the calls it replays)."""
        return max(0.0, statistics.median(self.samples_s))

    def to_dict(self) -> dict[str, Any]:
        return {
            "host_s": self.seconds,
            "samples_s": list(self.samples_s),
            "shapes": list(self.shapes),
            "called_s": list(self.called_s),
            "graph_s": list(self.graph_s),
        }


def host_cost_shapes(table: DispatchTable, most: int = HOST_SHAPES) -> list[int]:
    """S = 1 and the first S of every interval of the tuned table (each program's host path: its pieces, its
    split-K workspace), thinned evenly to at most `most`."""
    shapes = sorted({1} | {iv.lo for iv in table.intervals})
    if len(shapes) <= most:
        return shapes
    return sorted({shapes[round(i * (len(shapes) - 1) / (most - 1))] for i in range(most)})


def measure_host_costs(
    timers: GpuTimers, shapes: Sequence[int], samples: int = HOST_SAMPLES, check: Callable[[], None] | None = None
) -> dict[str, HostCost]:
    """Both sides' host costs: at least `samples` (called, graph) pairs per side, cycling through `shapes`, both
    sides at each S back to back, the side that goes first alternating."""
    if not shapes:
        raise ValueError("host costs need at least one S to sample at")
    at = [shapes[i % len(shapes)] for i in range(max(samples, len(shapes)))]
    called: dict[str, list[float]] = {side: [] for side in SIDES}
    graph: dict[str, list[float]] = {side: [] for side in SIDES}
    for i, S in enumerate(at):
        if check is not None:
            check()
        for side in SIDES if i % 2 == 0 else SIDES[::-1]:
            called[side].append(timers.called(side)(S))
            graph[side].append(timers.graph(side)(S))
    return {side: HostCost(tuple(at), tuple(called[side]), tuple(graph[side])) for side in SIDES}


@dataclass(frozen=True)
class GraphRound:
    """One paired round at an S: both sides' kernel-only seconds and which side was timed first."""

    ours_s: float
    cublas_s: float
    first: str


@dataclass
class PairedGraphRounds:
    """Times S in paired rounds of kernel-only times, each side's host cost added; keeps every round it takes.
    `measure` and `confirm` are what `vendor_routes.decide` calls."""

    timers: GpuTimers
    host: Mapping[str, HostCost]
    rounds: int = MIN_ROUNDS
    check: Callable[[], None] | None = None
    taken: dict[int, list[GraphRound]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rounds < 2:  # one round is no evidence (route_stats reads a single round as the caller's verdict)
            raise ValueError(f"paired timing needs at least 2 rounds per timing, got {self.rounds}")

    def _more(self, S: int, n: int) -> PointTiming:
        if self.check is not None:
            self.check()
        done = self.taken.setdefault(S, [])
        new: list[GraphRound] = []
        for _ in range(n):
            first = SIDES[(len(done) + len(new)) % 2]  # alternates over every round taken at S, confirmations too
            times = {side: self.timers.graph(side)(S) for side in (SIDES if first == UKERNEL else SIDES[::-1])}
            new.append(GraphRound(times[UKERNEL], times[LIBRARY], first))
        done.extend(new)
        h_ours, h_lib = self.host[UKERNEL].seconds, self.host[LIBRARY].seconds
        return PointTiming(tuple(r.ours_s + h_ours for r in new), {LIBRARY: tuple(r.cublas_s + h_lib for r in new)})

    def measure(self, S: int) -> PointTiming:
        """`rounds` paired rounds; more (up to route_stats.MAX_ROUNDS) while the sequential rule asks for them."""
        timing = self._more(S, self.rounds)
        while timing.needs_more_rounds:
            timing = timing.merged(self._more(S, max(1, CONFIRM_ROUNDS - timing.rounds)))
        return timing

    def confirm(self, S: int, timing: PointTiming) -> PointTiming:
        """A route boundary or a lone decision: `rounds` more paired rounds, pooled with the first."""
        return timing.merged(self._more(S, self.rounds))


@dataclass(frozen=True)
class GpuRouteDecision:
    decision: VendorDecision
    host: Mapping[str, HostCost]
    rounds: Mapping[int, tuple[GraphRound, ...]]  # every round taken at every timed S, in order

    @property
    def vendor(self) -> frozenset[int]:
        """The S in 1..s_max routed to cuBLAS."""
        return self.decision.vendor

    def record(self, table: DispatchTable) -> dict[str, Any]:
        """`validation.vendor_routes` of a job whose routed table is `table`: every round of every timed S."""
        timed = self.decision.timed
        return {
            "vendor": VENDOR,
            "routed_on": ROUTED_ON,
            "mode": MODE,
            "libraries": [LIBRARY],
            "rule": describe_rule(),
            "host_cost_s": {side: cost.to_dict() for side, cost in self.host.items()},
            "shapes_timed": len(timed),
            "vendor_S": len(self.vendor),
            "intervals": [[iv.lo, iv.hi] for iv in table.intervals if iv.vendor],
            # per timed S (the CPU record's keys, which the dashboard and accelerate's summary read): medians and
            # rounds as compared (kernel-only + host cost), then each round's kernel-only times and who went first
            "timed_s": {
                str(S): {
                    "tuned": t.ours_s,
                    "vendor": t.vendor_s,
                    LIBRARY: t.vendor_s,
                    **t.to_dict(),
                    "kernel_only_s": {
                        UKERNEL: [r.ours_s for r in self.rounds[S]],
                        LIBRARY: [r.cublas_s for r in self.rounds[S]],
                    },
                    "first": [r.first for r in self.rounds[S]],
                }
                for S, t in sorted(timed.items())
            },
            "decided_by": dict(self.decision.decided_by),
            "probes_S": list(self.decision.probes),
            "confirmed_S": list(self.decision.confirmed),  # re-timed: route boundaries and lone decisions
        }


def not_routed_record(reason: str) -> dict[str, Any]:
    """`validation.vendor_routes` of a job that routed nothing (routing off, or no torch with CUDA)."""
    return {"vendor": VENDOR, "routed_on": f"not routed: {reason}", "shapes_timed": 0, "vendor_S": 0, "intervals": []}


def decide_gpu_routes(
    s_max: int,
    predicted: Sequence[float],
    timers: GpuTimers,
    shapes: Iterable[int],
    host_shapes: Sequence[int],
    must: Iterable[int] = (),
    check: Callable[[], None] | None = None,
    rounds: int = MIN_ROUNDS,
) -> GpuRouteDecision:
    """Which S in 1..s_max go to cuBLAS: host costs first, then `vendor_routes.decide` over `shapes` (and
    `must`) on paired rounds, with every route boundary and lone decision re-timed. `predicted[S - 1]` is the
    DP's predicted time of our program at S (for the gaps between swept S); `check` runs before every timing
    (the job's stop check)."""
    host = measure_host_costs(timers, host_shapes, check=check)
    sampler = PairedGraphRounds(timers, host, rounds, check)
    decision = decide(s_max, predicted, sampler.measure, must=must, grid=sorted(set(shapes)), confirm=sampler.confirm)
    return GpuRouteDecision(decision, host, {S: tuple(r) for S, r in sampler.taken.items()})


def keeps_ukernel(t: PointTiming) -> bool:
    """The rule at one timed S. One round is no evidence: the sign test's p for 1 win of 1 is 1/2."""
    return t.rounds > 1 and t.ukernel_wins


def replay_sweep(sweep: Mapping[int, Mapping[str, float]]) -> dict[str, Any]:
    """The rule replayed on a sweep of one sample per side and S (the older record's `sweep_s`: ours_called_s,
    cublas_called_s, ours_graph_s, cublas_graph_s), next to the older rule's decision on the same samples. The
    host costs are the medians over the swept S; every S is one round, so no uKernel is kept (p = 1/2);
    `margin_met` says whether its one ratio would pass the margin if further rounds agreed."""
    if not sweep:
        raise ValueError("nothing to replay")
    shapes = tuple(sorted(sweep))
    host = {
        side: HostCost(
            shapes,
            tuple(sweep[S][f"{key}_called_s"] for S in shapes),
            tuple(sweep[S][f"{key}_graph_s"] for S in shapes),
        )
        for side, key in ((UKERNEL, "ours"), (LIBRARY, "cublas"))
    }
    old = vendor_wins({S: (sweep[S]["ours_called_s"], sweep[S]["cublas_called_s"]) for S in shapes}, max(shapes))
    per_s = {}
    for S in shapes:
        t = PointTiming.single(
            sweep[S]["ours_graph_s"] + host[UKERNEL].seconds,
            sweep[S]["cublas_graph_s"] + host[LIBRARY].seconds,
            LIBRARY,
        )
        ratio = t.ratios[0]
        per_s[S] = {
            "route": UKERNEL if keeps_ukernel(t) else LIBRARY,
            "older_rule_route": LIBRARY if S in old else UKERNEL,
            "ratio": ratio,
            "margin_met": ratio <= 1.0 - UKERNEL_MARGIN,
            "sign_test_p": sign_test_p(t.wins, t.rounds),
        }
    return {"host_cost_s": {side: cost.to_dict() for side, cost in host.items()}, "per_S": per_s}
