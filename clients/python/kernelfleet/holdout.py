"""The A/B holdout: a small share of the calls a host serves run its baseline instead, so the fleet's saving is
measured on production traffic rather than modelled (issue 35 item 1).

The baseline is what the host would run without KernelFleet: the layer's own PyTorch computation under
`kernelfleet.torch.accelerate`, the library a `Dispatcher` names (`Dispatcher.hold_out`) for arrays. Per concrete
shape S, from the second call on (the first packs weights and resolves the route: not a sample), every `every`-th
call runs the baseline; the others are served as usual. Each side's calls, seconds and squared seconds are summed
per S, so the service can compute both means and their variances (and so a confidence interval for the saving)
from sums that add across hosts and reports. Calls are interleaved in time on the same host and the same
operands, so what drifts (load, clocks, caches) reaches both sides alike.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

T = TypeVar("T")
MAX_TRACKED_SHAPES = 4096  # like the dispatchers' usage: beyond it, shapes are served without a turn


@dataclass
class HoldoutSample:
    """Both sides' sums at one S since the last report."""

    served_calls: int = 0
    served_s: float = 0.0
    served_s2: float = 0.0
    baseline_calls: int = 0
    baseline_s: float = 0.0
    baseline_s2: float = 0.0

    def add(self, held: bool, seconds: float) -> None:
        if held:
            self.baseline_calls += 1
            self.baseline_s += seconds
            self.baseline_s2 += seconds * seconds
        else:
            self.served_calls += 1
            self.served_s += seconds
            self.served_s2 += seconds * seconds

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Holdout:
    """Which calls run the baseline (one in `every` per S), and both sides' timings."""

    def __init__(self, every: int, baseline: str) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 2:
            raise ValueError(f"holdout: one call in `every` runs the baseline, every ≥ 2; got {every!r}")
        self.every = every
        self.baseline = baseline  # what the held-out calls run, as a vendor library name ("torch", "numpy")
        self._turns: dict[int, int] = {}
        self._samples: dict[int, HoldoutSample] = {}
        self._lock = threading.Lock()

    def run(self, S: int, serve: Callable[[], T], baseline: Callable[[], T], now: Callable[[], float]) -> T:
        """One call at S: served or held out, timed on its side (the first call at S is not a sample)."""
        turn = self._turns.get(S, 0) + 1
        if turn == 1:
            if len(self._turns) < MAX_TRACKED_SHAPES:  # beyond the bound, S never gets a turn: served, not sampled
                self._turns[S] = turn
            return serve()
        self._turns[S] = turn
        held = turn % self.every == 0
        start = now()
        y = baseline() if held else serve()
        seconds = now() - start
        with self._lock:  # against a concurrent samples(reset=True)
            sample = self._samples.get(S)
            if sample is None:
                sample = self._samples[S] = HoldoutSample()
            sample.add(held, seconds)
        return y

    def samples(self, reset: bool = False) -> dict[int, HoldoutSample]:
        """Both sides' sums per S since the last reset."""
        with self._lock:
            snapshot = {S: HoldoutSample(**asdict(s)) for S, s in self._samples.items()}
            if reset:
                self._samples = {}
        return snapshot
