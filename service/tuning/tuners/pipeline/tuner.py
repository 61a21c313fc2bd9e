"""Model-guided tuning of pipelining schedules (ALCOP §5.5.3, thesis §3.6).

Two searches over the legal configurations of the space (`space` + `rules`):

- "analytical": rank every configuration by the analytical model and measure the first `trials`
  (ALCOP's "Analytical only").
- "anal+xgb" (ALCOP's method): pre-train an XGBoost cost model on (configuration, predicted latency)
  pairs for the whole space, with no compilation or measurement; then propose the configurations it
  scores best, measure them, refit on the measurements (the analytical labels stay as a prior, shifted
  onto the measured scale) and repeat. ALCOP proposes by simulated annealing on the cost model; this
  space is small enough (a few thousand configurations) to score exhaustively, which is what annealing
  approximates.

Either way the proposals are kept in order, so the job reports best-in-top-k (the best of the first k
proposals as a share of the best found) and the model's Spearman ρ against what was measured.

Measuring is the sink's (configurations → seconds, inf for a failure): the GPU worker builds and times
on its device; nothing here needs a GPU, TVM or the service.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from service.tuning.tuners.base import StopSignal
from service.tuning.tuners.pipeline.model import GPUConstants, best_in_top_k, occupancy, predict, rank_correlation
from service.tuning.tuners.pipeline.rules import check_config
from service.tuning.tuners.pipeline.space import (
    GemmShape,
    PipelineConfig,
    SpaceLimits,
    enumerate_space,
    feasible,
    pipeline_variants,
)

Mode = Literal["anal+xgb", "analytical"]
MODES: tuple[Mode, ...] = ("anal+xgb", "analytical")
Measure = Callable[[Sequence[PipelineConfig]], list[float]]

_MEASURED_WEIGHT = 20.0  # one measurement outweighs this many analytical labels when refitting


@dataclass(frozen=True)
class PipelineTask:
    gemm: GemmShape
    gpu: GPUConstants
    trials: int
    mode: Mode = "anal+xgb"
    batch_size: int = 8  # configurations measured per round
    seed: int = 0
    limits: SpaceLimits = field(default_factory=SpaceLimits)
    # what a killed attempt of the job measured (inf: failed): counted against `trials`, never measured again
    resume_from: tuple[tuple[PipelineConfig, float], ...] = ()


class PipelineSink(StopSignal, Protocol):
    def measure(self, configs: Sequence[PipelineConfig]) -> list[float]:
        """Seconds of each configuration (inf: it failed), reported to the job as they are measured."""


@dataclass(frozen=True)
class MeasuringSink:
    """A PipelineSink from a measuring function and, optionally, a stop signal: what the job and benches pass."""

    measure_configs: Measure
    stop: Callable[[], bool] = lambda: False

    def measure(self, configs: Sequence[PipelineConfig]) -> list[float]:
        return self.measure_configs(configs)

    def should_stop(self) -> bool:
        return self.stop()


@dataclass
class Proposal:
    config: PipelineConfig
    predicted_s: float
    measured_s: float = math.inf


@dataclass
class PipelineOutcome:
    proposals: list[Proposal]  # in the order they were proposed and measured
    candidates: int  # legal configurations in the space
    rejected: dict[str, int] = field(default_factory=dict)  # configurations rejected before build, by rule

    @property
    def best(self) -> Proposal | None:
        ok = [p for p in self.proposals if math.isfinite(p.measured_s)]
        return min(ok, key=lambda p: p.measured_s) if ok else None

    def best_in_top(self, k: int) -> float:
        return best_in_top_k([p.measured_s for p in self.proposals], k)

    def spearman(self) -> float:
        ok = [p for p in self.proposals if math.isfinite(p.measured_s) and math.isfinite(p.predicted_s)]
        return rank_correlation([p.predicted_s for p in ok], [p.measured_s for p in ok]) if len(ok) > 1 else math.nan

    def quality(self) -> dict[str, Any]:
        """What a job records about the model's quality (ALCOP Figs. 5.13–5.14)."""
        ks = [k for k in (1, 10, 50) if k <= len(self.proposals)]
        return {
            "best_in_top_k": {str(k): round(self.best_in_top(k), 4) for k in ks},
            "spearman_predicted_vs_measured": None if math.isnan(rho := self.spearman()) else round(rho, 4),
            "measured": len(self.proposals),
            "candidates": self.candidates,
            "rejected_by_rule": self.rejected,
        }


def legal_space(gemm: GemmShape, limits: SpaceLimits = SpaceLimits()) -> tuple[list[PipelineConfig], dict[str, int]]:
    """The configurations that pass ALCOP's rules, and how many each rule rejected."""
    legal: list[PipelineConfig] = []
    rejected: dict[str, int] = {}
    for config in enumerate_space(gemm, limits):
        violations = check_config(config)
        for v in violations:
            rejected[v.rule] = rejected.get(v.rule, 0) + 1
        if not violations:
            legal.append(config)
    return legal, rejected


def pipelines_for_tile(
    gemm: GemmShape,
    tile: tuple[int, int, int, int, int],
    gpu: GPUConstants,
    top_k: int | None = None,
    limits: SpaceLimits = SpaceLimits(),
) -> list[tuple[PipelineConfig, float]]:
    """The legal pipelines (shared and register stages, async copies, fusion) of one fixed tile
    (B_m, B_n, B_k, t_m, t_n), fastest first by the analytical model: how a `ukernel` job on a GPU asks this
    module which depths to measure for a uKernel instead of searching them itself."""
    bm, bn, bk, tm, tn = tile
    configs = [
        PipelineConfig(bm, bn, bk, tm, tn, smem, async_copy, reg, fuse)
        for smem, async_copy, reg, fuse in pipeline_variants(limits)
    ]
    legal = [c for c in configs if feasible(c, gemm, limits) is None and not check_config(c)]
    ranked = sorted(((c, predict(gemm, c, gpu).seconds) for c in legal), key=lambda item: item[1])
    return ranked[:top_k] if top_k is not None else ranked


def features(gemm: GemmShape, config: PipelineConfig, gpu: GPUConstants) -> list[float]:
    """What the cost model sees: the schedule's knobs and the quantities they decide (never the analytical
    prediction itself, which is the pre-training label)."""
    occ = occupancy(gemm, config, gpu)
    k_steps = math.ceil(gemm.k / config.bk)
    return [
        math.log2(config.bm),
        math.log2(config.bn),
        math.log2(config.bk),
        math.log2(config.tm),
        math.log2(config.tn),
        config.smem_stages,
        float(config.async_copy),
        config.reg_stages,
        float(config.fuse_inner),
        math.log2(config.threads),
        config.smem_bytes(gemm.dtype_bytes) / 1024,
        occ.blocks_per_sm,
        math.log2(max(occ.blocks, 1)),
        occ.batches,
        occ.resident_per_sm,
        math.log2(k_steps),
        min(config.smem_stages, k_steps) * float(config.async_copy),
        config.tm * config.tn / (config.tm + config.tn),  # FMAs per shared load: the register tile's reuse
        config.bm * config.bn / (config.bm + config.bn),  # the block tile's reuse of global loads
    ]


class CostModel:
    """XGBoost regression of -log(seconds); higher scores are faster."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.booster: Any = None

    def fit(self, x: np.ndarray, y: np.ndarray, weight: np.ndarray | None = None) -> None:
        import xgboost as xgb

        data = xgb.DMatrix(x, label=y, weight=weight)
        params = {"max_depth": 6, "eta": 0.2, "subsample": 0.9, "seed": self.seed, "nthread": 1, "verbosity": 0}
        self.booster = xgb.train(params, data, num_boost_round=120)

    def score(self, x: np.ndarray) -> np.ndarray:
        import xgboost as xgb

        if self.booster is None:
            raise RuntimeError("the cost model is not trained")
        return np.asarray(self.booster.predict(xgb.DMatrix(x)))


def _labels(seconds: Sequence[float]) -> np.ndarray:
    return -np.log(np.maximum(np.asarray(seconds, dtype=np.float64), 1e-12))


class PipelineTuner:
    name = "pipeline"

    def tune(self, task: PipelineTask, sink: PipelineSink) -> PipelineOutcome:
        space, rejected = legal_space(task.gemm, task.limits)
        predicted = [predict(task.gemm, c, task.gpu).seconds for c in space]
        outcome = PipelineOutcome(proposals=[], candidates=len(space), rejected=rejected)
        if not space:
            return outcome
        budget = min(task.trials, len(space))
        measured = self._resume(outcome, task.resume_from[:budget], predicted, space)
        if task.mode == "analytical":
            order = [i for i in sorted(range(len(space)), key=lambda i: predicted[i]) if i not in measured]
            while len(measured) < budget and not sink.should_stop():
                batch = order[: min(task.batch_size, budget - len(measured))]
                order = order[len(batch) :]
                seconds = self._measure(outcome, [space[i] for i in batch], predicted, space, sink)
                measured.update(zip(batch, seconds, strict=True))
            return outcome
        x = np.asarray([features(task.gemm, c, task.gpu) for c in space])
        prior = _labels(predicted)
        model = CostModel(task.seed)
        model.fit(x, prior)  # pre-training: analytical labels only, nothing built or measured
        if measured:
            self._refit(model, x, prior, measured)
        while len(measured) < budget and not sink.should_stop():
            scores = model.score(x)
            pending = [i for i in np.argsort(-scores, kind="stable") if int(i) not in measured]
            batch = [int(i) for i in pending[: min(task.batch_size, budget - len(measured))]]
            seconds = self._measure(outcome, [space[i] for i in batch], predicted, space, sink)
            measured.update(zip(batch, seconds, strict=True))
            self._refit(model, x, prior, measured)
        return outcome

    @staticmethod
    def _resume(
        outcome: PipelineOutcome,
        earlier: Sequence[tuple[PipelineConfig, float]],
        predicted: list[float],
        space: list[PipelineConfig],
    ) -> dict[int, float]:
        """An earlier attempt's measurements as this search's first proposals (space index → seconds); a
        configuration outside this space (other limits) is left out, a repeated one counted once."""
        index = {c: i for i, c in enumerate(space)}
        measured: dict[int, float] = {}
        for config, seconds in earlier:
            i = index.get(config)
            if i is not None and i not in measured:
                measured[i] = seconds
                outcome.proposals.append(Proposal(config, predicted[i], seconds))
        return measured

    @staticmethod
    def _measure(
        outcome: PipelineOutcome,
        configs: list[PipelineConfig],
        predicted: list[float],
        space: list[PipelineConfig],
        sink: PipelineSink,
    ) -> list[float]:
        seconds = sink.measure(configs)
        index = {c: i for i, c in enumerate(space)}
        for c, s in zip(configs, seconds, strict=True):
            outcome.proposals.append(Proposal(c, predicted[index[c]], s))
        return seconds

    @staticmethod
    def _refit(model: CostModel, x: np.ndarray, prior: np.ndarray, measured: dict[int, float]) -> None:
        """Measured labels where there are measurements; elsewhere the analytical prior, shifted by the mean
        measured-vs-predicted log ratio so both speak the same scale. Failed builds score as very slow."""
        ok = {i: s for i, s in measured.items() if math.isfinite(s) and s > 0}
        y = prior.copy()
        if ok:
            shift = float(np.mean([_labels([s])[0] - prior[i] for i, s in ok.items()]))
            y += shift
            for i, s in ok.items():
                y[i] = _labels([s])[0]
        floor = float(y.min()) - 1.0
        weight = np.ones(len(y))
        for i, s in measured.items():
            if not (math.isfinite(s) and s > 0):
                y[i] = floor
            weight[i] = _MEASURED_WEIGHT
        model.fit(x, y, weight)
