"""The saving measured from A/B holdout sums (service.workers.fleet.savings): the arithmetic, and that its 95 %
interval covers the true saving about 95 % of the time on samples drawn with a known answer."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from service.store.fleet import HoldoutSums, Usage
from service.workers.fleet.savings import MIN_SIDE_CALLS, Side, measure

DAY = dt.date(2026, 11, 20)


def _sums(shape: str, served: np.ndarray, baseline: np.ndarray, wh: str = "w", host: str = "torch") -> HoldoutSums:
    return HoldoutSums(wh, "fp", "", shape, host, len(served), float(served.sum()), float((served**2).sum()),
                       len(baseline), float(baseline.sum()), float((baseline**2).sum()))  # fmt: skip


def test_the_saving_is_served_volume_times_the_difference_of_the_means() -> None:
    served, baseline = np.array([1.0, 2.0, 3.0]), np.array([3.0, 4.0, 5.0])  # means 2 and 4, variances 1 and 1
    usage = [Usage("w", "fp", "M=8", 1003, 2000.0, 0), Usage("w", "fp", "M=9", 10, 2000.0, 10)]  # M=9: unmeasured
    m = measure(usage, [_sums("M=8", served, baseline)], DAY, DAY, days=1, labels={"w": "dense"})
    assert m.saved_s_per_day == pytest.approx(1000 * 2.0)  # (1003 calls - 3 held out) x (4 - 2) s
    assert m.ci95_s_per_day == pytest.approx(1.959964 * 1000 * np.sqrt(1 / 3 + 1 / 3))
    assert m.speedup == pytest.approx(2.0) and m.holdout_calls == 3 and m.served_calls == 1000
    assert m.measured_share == pytest.approx(0.5)  # M=8's kernel seconds of the fleet's
    [task] = m.tasks
    assert task.label == "dense" and task.shapes == 1 and task.saved_s_per_day == pytest.approx(2000.0)


def test_misses_save_nothing_their_calls_are_not_served_volume() -> None:
    """400 of 1003 calls at M=8 ran no table (forwards a PyTorch host ran as the model's own, S past the table):
    only the rest is served volume, and only their share of the kernel seconds is measured."""
    served, baseline = np.array([1.0, 2.0, 3.0]), np.array([3.0, 4.0, 5.0])
    m = measure([Usage("w", "fp", "M=8", 1003, 100.0, 400)], [_sums("M=8", served, baseline)], DAY, DAY, days=1)
    assert m.served_calls == 603 - 3 and m.saved_s_per_day == pytest.approx(600 * 2.0)
    assert m.measured_share == pytest.approx(603 / 1003)


def test_hosts_with_different_baselines_at_one_shape_split_its_volume_and_are_never_summed() -> None:
    """numpy hosts (baseline mean 2) and PyTorch hosts (mean 4) both served at mean 1: a quarter of the sampled
    calls came from the numpy hosts, so a quarter of the volume saves 1 s a call and the rest 3 s."""
    ones = np.array([0.5, 1.0, 1.5])
    numpy_hosts = _sums("M=8", ones, np.array([1.0, 2.0, 3.0]), host="numpy")
    torch_hosts = _sums("M=8", np.tile(ones, 3), np.array([3.0, 4.0, 5.0] * 3), host="torch")
    m = measure([Usage("w", "fp", "M=8", 2400, 10.0, 0)], [numpy_hosts, torch_hosts], DAY, DAY, days=1)
    assert m.holdout_calls == 12 and m.served_calls == (600 - 3) + (1800 - 9)
    assert m.saved_s_per_day == pytest.approx((600 - 3) * 1.0 + (1800 - 9) * 3.0)
    assert m.measured_share == pytest.approx(1.0)


def test_a_side_with_too_few_samples_measures_nothing() -> None:
    few = np.ones(MIN_SIDE_CALLS - 1)
    assert Side.of(len(few), float(few.sum()), float(few.sum())) is None
    m = measure([Usage("w", "fp", "M=8", 100, 1.0, 0)], [_sums("M=8", np.ones(50), few)], DAY, DAY, days=1)
    assert m.saved_s_per_day == 0 and m.ci95_s_per_day == 0 and m.tasks == [] and m.speedup is None


def test_the_interval_covers_the_true_saving_about_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(7)
    volumes = {"M=1": 5000, "M=8": 2000, "M=64": 300}
    truth_means = {"M=1": (1e-5, 1.2e-5), "M=8": (3e-5, 3.1e-5), "M=64": (2e-4, 1.9e-4)}  # (served, baseline)
    truth = sum(v * (truth_means[k][1] - truth_means[k][0]) for k, v in volumes.items())
    covered, trials = 0, 400
    for _ in range(trials):
        sums = []
        for key, (mean_s, mean_b) in truth_means.items():
            # skewed timings, as real ones are: lognormal with a 30 % spread
            served = mean_s * rng.lognormal(-0.045, 0.3, size=60)
            base = mean_b * rng.lognormal(-0.045, 0.3, size=12)
            sums.append(_sums(key, served, base))
        usage = [Usage("w", "fp", k, v + 12, 1.0, 0) for k, v in volumes.items()]
        m = measure(usage, sums, DAY, DAY, days=1)
        covered += abs(m.saved_s_per_day - truth) <= m.ci95_s_per_day
    assert 0.88 <= covered / trials <= 0.99
