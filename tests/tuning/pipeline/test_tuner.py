"""Model-guided tuning (ALCOP's "Anal.+XGB" and "Analytical only") without a GPU.

Measurements here come from a synthetic GPU: the analytical model with constants that differ from the
prior's (slower DRAM and L2, longer latencies, a lower clock). It is named as synthetic wherever used; it
exercises the search loop, not the hardware.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from service.tuning.tuners.pipeline.model import GPUConstants, predict
from service.tuning.tuners.pipeline.space import GemmShape, PipelineConfig
from service.tuning.tuners.pipeline.tuner import (
    CostModel,
    MeasuringSink,
    Mode,
    PipelineTask,
    PipelineTuner,
    features,
    legal_space,
    pipelines_for_tile,
)
from service.tuning.tuners.rank_stats import spearman

PRIOR = GPUConstants.for_arch("sm_80")
SYNTHETIC_GPU = PRIOR.replaced(
    dram_bw=PRIOR.dram_bw / 3, lat_dram_s=PRIOR.lat_dram_s * 3, clock_hz=PRIOR.clock_hz * 0.7, llc_bw=PRIOR.llc_bw / 2
)
RN50_FC = GemmShape(1, 64, 1024, 2048)


class SyntheticMeasure:
    """Seconds from the synthetic GPU; every 7th configuration 'fails to build' (inf), as real ones sometimes do."""

    def __init__(self, gemm: GemmShape) -> None:
        self.gemm = gemm
        self.calls: list[PipelineConfig] = []

    def __call__(self, configs: Sequence[PipelineConfig]) -> list[float]:
        out = []
        for c in configs:
            self.calls.append(c)
            out.append(math.inf if len(self.calls) % 7 == 0 else predict(self.gemm, c, SYNTHETIC_GPU).seconds)
        return out


def test_pretraining_on_predictions_alone_learns_the_analytical_ranking() -> None:
    space, _ = legal_space(RN50_FC)
    x = np.asarray([features(RN50_FC, c, PRIOR) for c in space])
    predicted = [predict(RN50_FC, c, PRIOR).seconds for c in space]
    model = CostModel(seed=0)
    model.fit(x, -np.log(predicted))  # no build, no measurement
    assert spearman(list(-model.score(x)), predicted) > 0.9


def test_analytical_only_measures_the_model_top_k_in_order() -> None:
    measure = SyntheticMeasure(RN50_FC)
    out = PipelineTuner().tune(PipelineTask(RN50_FC, PRIOR, trials=20, mode="analytical"), MeasuringSink(measure))
    assert len(out.proposals) == len(measure.calls) == 20
    predicted = [p.predicted_s for p in out.proposals]
    assert predicted == sorted(predicted)
    space, _ = legal_space(RN50_FC)
    assert min(predicted) == min(predict(RN50_FC, c, PRIOR).seconds for c in space)


def test_anal_xgb_measures_each_proposal_once_and_records_its_quality() -> None:
    measure = SyntheticMeasure(RN50_FC)
    out = PipelineTuner().tune(PipelineTask(RN50_FC, PRIOR, trials=50, batch_size=10), MeasuringSink(measure))
    assert len(measure.calls) == len(set(measure.calls)) == 50
    best = out.best
    assert best is not None and math.isfinite(best.measured_s)
    assert best.measured_s == min(s for p in out.proposals if math.isfinite(s := p.measured_s))
    quality = out.quality()
    assert set(quality["best_in_top_k"]) == {"1", "10", "50"} and quality["best_in_top_k"]["50"] == 1.0
    assert quality["best_in_top_k"]["10"] >= 0.9  # ALCOP: 95 % of the optimum within 10 trials
    assert quality["measured"] == 50 and quality["candidates"] > 1000
    assert -1.0 <= quality["spearman_predicted_vs_measured"] <= 1.0
    # against every configuration of the space on the synthetic GPU, the 50 trials found ≥ 95 % of the optimum
    space, _ = legal_space(RN50_FC)
    optimum = min(predict(RN50_FC, c, SYNTHETIC_GPU).seconds for c in space)
    assert optimum / best.measured_s >= 0.95


def test_a_stopped_search_stops_between_rounds() -> None:
    measure = SyntheticMeasure(RN50_FC)
    rounds = iter([False, True])
    sink = MeasuringSink(measure, lambda: next(rounds))
    out = PipelineTuner().tune(PipelineTask(RN50_FC, PRIOR, trials=40, batch_size=8), sink)
    assert len(out.proposals) == 8


@pytest.mark.parametrize("mode", ["anal+xgb", "analytical"])
def test_a_retry_resumes_from_the_killed_attempts_measurements(mode: Mode) -> None:
    """Issue 34 item 7: a retry counts what the killed attempt measured against the budget, measures none of it
    again, and proposes what an uninterrupted search would have (the seconds are a function of the configuration,
    so both runs see the same ones)."""

    def seconds_of(configs: Sequence[PipelineConfig]) -> list[float]:
        calls.extend(configs)
        return [math.inf if sum(map(ord, c.key)) % 7 == 0 else predict(RN50_FC, c, SYNTHETIC_GPU).seconds
                for c in configs]  # fmt: skip

    calls: list[PipelineConfig] = []
    task = PipelineTask(RN50_FC, PRIOR, trials=24, mode=mode, batch_size=8)
    whole = PipelineTuner().tune(task, MeasuringSink(seconds_of))
    calls.clear()
    rounds = iter([False, False, True])
    killed = PipelineTuner().tune(task, MeasuringSink(seconds_of, lambda: next(rounds)))
    assert len(killed.proposals) == len(calls) == 16
    earlier = tuple((p.config, p.measured_s) for p in killed.proposals)
    calls.clear()
    retry = PipelineTuner().tune(replace(task, resume_from=earlier), MeasuringSink(seconds_of))
    assert len(calls) == 8 and not set(calls) & {c for c, _ in earlier}  # only the rest of the budget
    assert [p.config for p in retry.proposals] == [p.config for p in whole.proposals]
    assert retry.best is not None and whole.best is not None and retry.best.config == whole.best.config


def test_a_retry_counts_a_repeated_earlier_measurement_once() -> None:
    space, _ = legal_space(RN50_FC)
    earlier = (*((c, 1e-5 * (i + 1)) for i, c in enumerate(space[:3])), (space[0], 1e-9))  # the first one counts
    calls: list[PipelineConfig] = []
    out = PipelineTuner().tune(
        PipelineTask(RN50_FC, PRIOR, trials=4, resume_from=earlier),
        MeasuringSink(lambda cs: calls.extend(cs) or [1.0] * len(cs)),
    )
    assert len(calls) == 1 and calls[0] not in space[:3] and len(out.proposals) == 4
    assert out.best is not None and out.best.config == space[0] and out.best.measured_s == 1e-5


def test_pipelines_for_one_tile_rank_its_depths_for_a_ukernel() -> None:
    """What a GPU uKernel asks: which of its tile's pipelines to measure first (long reduction: async wins)."""
    ranked = pipelines_for_tile(RN50_FC, (32, 32, 16, 2, 4), PRIOR)
    assert all((c.bm, c.bn, c.bk, c.tm, c.tn) == (32, 32, 16, 2, 4) for c, _ in ranked)
    seconds = [s for _, s in ranked]
    assert seconds == sorted(seconds) and len(ranked) > 20
    assert ranked[0][0].async_copy and ranked[0][0].smem_stages > 1
    assert len(pipelines_for_tile(RN50_FC, (32, 32, 16, 2, 4), PRIOR, top_k=3)) == 3
