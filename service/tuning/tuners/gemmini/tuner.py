"""The `gemmini` tuner on the analytical model alone: BACO's co-exploration (search.co_explore) of the hardware
and every layer's mapping, or, where the backend measures only hardware that is already built (FireSim
bitstreams), the mappings on those configs alone (search.best_fixed_hw). The job kind runs the first with the
backend in the loop (cotune.py: a second round on the model calibrated to the backend)."""

from __future__ import annotations

from dataclasses import dataclass

from service.tuning.gemmini.space import HwConfig, Layer
from service.tuning.tuners.base import StopSignal
from service.tuning.tuners.gemmini.search import SearchResult, best_fixed_hw, co_explore


@dataclass(frozen=True)
class BacoTask:
    layers: list[Layer]  # the network: each layer weighted by its occurrences
    budget: int  # analytical-model calls
    seed: int = 0
    hardware_choices: list[HwConfig] | None = None  # None: any config Gemmini's generator can build


class BacoTuner:
    name = "gemmini-baco"

    def tune(self, task: BacoTask, sink: StopSignal) -> SearchResult:
        """The whole search, not interrupted: it costs model calls only and reports nothing as it goes (the
        job records the chosen and explored configs once it has measured them), so the job asks `sink`
        whether to go on once this returns. Raises RuntimeError where no point is valid."""
        if task.hardware_choices is None:
            return co_explore(task.layers, task.budget, seed=task.seed)
        return best_fixed_hw(task.layers, task.hardware_choices, task.budget, seed=task.seed)
