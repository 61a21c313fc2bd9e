"""DietCode's micro-kernel model, FTuner's SIA score, and Spearman's ρ, on hand-computed numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.tuning.tuners.ukernel.cost import (
    SIAWeights,
    compute_to_memory,
    dietcode_predict,
    f_mk_from_measurement,
    rank_sia,
    sia_score,
    spearman,
    tasks,
)


def test_dietcode_model() -> None:
    # N=64, mt=4, nt=32: 2 N-tiles. M=8 → 2 M-tiles, 4 tasks on 2 cores: full waves, f_MK = 20 µs / 2.
    f_mk = f_mk_from_measurement(2e-5, M=8, mt=4, nt=32, N=64, cores=2)
    assert f_mk == pytest.approx(1e-5)
    predict = [dietcode_predict(f_mk, S, mt=4, nt=32, N=64, cores=2) for S in (3, 5, 8, 9)]
    assert predict == pytest.approx([1e-5, 2e-5, 2e-5, 3e-5])  # ceil(S/4) tiles, always full waves
    # On 4 cores: S=3 → 2 tasks (occupancy 1/2, penalty 2); S=9 → 6 tasks in 2 waves of 4 (occupancy 3/4).
    assert dietcode_predict(1e-5, 3, 4, 32, 64, cores=4) == pytest.approx(2e-5)
    assert dietcode_predict(1e-5, 9, 4, 32, 64, cores=4) == pytest.approx(4e-5)
    assert f_mk_from_measurement(4e-5, M=9, mt=4, nt=32, N=64, cores=4) == pytest.approx(1e-5)  # round trip
    assert tasks(9, 4, 32, 64) == 6


def test_compute_to_memory_ratio() -> None:
    # 2·4·32·32 = 8192 FLOPs over (4·32 + 32·32 + 4·32)·4 = 5120 bytes
    assert compute_to_memory(4, 32, 32) == pytest.approx(1.6)
    assert compute_to_memory(8, 32, 32) == pytest.approx(16384 / 6144)


def test_sia_score_and_ranking() -> None:
    ref = compute_to_memory(8, 32, 32)
    # mt=4 at S=6: CMR 1.6/2.667 = 0.6, padding 6/8 = 0.75, 4 tasks on 4 cores → 0.45
    assert sia_score(4, 32, S=6, N=64, K=32, cores=4, cmr_ref=ref) == pytest.approx(0.45)
    assert sia_score(4, 32, 6, 64, 32, 4, ref, SIAWeights(intensity=2.0)) == pytest.approx(0.36 * 0.75)
    assert sia_score(8, 32, 6, 64, 32, 4, ref, SIAWeights(utilisation=0.0)) == pytest.approx(0.75)
    # S=6: mt=8 pads to 8 and gives only 2 tasks for 4 cores → 1·0.75·0.5 = 0.375 < 0.45
    ranked = rank_sia([(8, 32), (4, 32)], S=6, N=64, K=32, cores=4)
    assert [t for t, _ in ranked] == [(4, 32), (8, 32)]
    assert [s for _, s in ranked] == pytest.approx([0.45, 0.375])
    # S=16: both pad nothing and fill the cores, so the intensity decides: 1.0 vs 0.6
    assert [t for t, _ in rank_sia([(4, 32), (8, 32)], S=16, N=64, K=32, cores=4)] == [(8, 32), (4, 32)]


def test_spearman() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 45]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties share ranks: a → [1, 2.5, 2.5, 4]; ρ = 4.5 / √(4.5·5)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(30), rng.standard_normal(30)
    d = np.argsort(np.argsort(a)) - np.argsort(np.argsort(b))
    assert spearman(list(a), list(b)) == pytest.approx(1 - 6 * float((d * d).sum()) / (30 * (30**2 - 1)))
    with pytest.raises(ValueError):
        spearman([1], [1])
