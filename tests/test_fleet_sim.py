"""`kernelfleet fleet simulate --quick` on the real loop: API, worker, daily run and jobs through the Supervisor.

Two simulated days on one-layer BERT and GPT-2 (the same distinct dense workloads as the 12-layer models, with
occurrences per layer), whole models served by `accelerate` as PyTorch hosts run them, one forward per request:
day 1 has no table (forwards run as the model's own, reported, measured as saving nothing), GPT-2 appears on day 2,
savings are the
service's measurement of the hosts' A/B holdout (with an interval), and the tuning cost comes from the store's job
times, not from constants.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
from rich.console import Console

from service import fleet_sim
from tests.helpers import free_port

pytestmark = pytest.mark.slow


def test_quick_simulation_serves_real_layers_adds_gpt2_on_day_2_and_measures_savings_and_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("transformers")
    monkeypatch.setenv("KERNELFLEET_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("KERNELFLEET_FLEET_DAILY_TRIALS", "16")  # one unit: one ukernel job
    monkeypatch.setenv("KERNELFLEET_FLEET_UNIT_TRIALS", "16")
    for var in ("KERNELFLEET_DATABASE_URL", "KERNELFLEET_BROKER_URL"):
        monkeypatch.delenv(var, raising=False)
    out = io.StringIO()
    [result] = fleet_sim.main(
        days=2,
        requests=12,
        quick=True,
        n_layers=1,
        port=free_port(),
        data_dir=tmp_path,
        console=Console(file=out, width=200),
    )
    text = out.getvalue()

    # the models' distinct dense workloads: BERT's Q/K/V/out (and pooler), FFN up (gelu) and down; GPT-2's
    # c_attn, c_proj, c_fc (its gelu_new module fused, as accelerate fuses it) and mlp c_proj (shared with BERT's down)
    described = {d for d, _, _ in result.layers}
    assert described == {
        "dense N=768 K=768 (+ bias)",
        "dense N=3072 K=768 (+ bias, gelu)",
        "dense N=768 K=3072 (+ bias)",
        "dense N=3072 K=768 (+ bias, gelu_tanh)",
        "dense N=2304 K=768 (+ bias)",
    }
    assert sum(served for _, _, served in result.layers) == 2  # --quick serves the top two
    assert sum(share for _, share, _ in result.layers) == pytest.approx(1.0)

    day1, day2 = result.rows
    assert set(day1.requests) == {"bert"} and set(day2.requests) == {"bert", "gpt2"}  # GPT-2 added mid-run
    assert day1.tables == 0  # nothing tuned yet
    assert set(day1.by_route) <= {"no table"}  # the split says so too
    # the hosts hold calls out without tables too (PyTorch on both sides), but every call is a miss: no table ran it,
    # so nothing is served volume and nothing is saved; the calls still tell the run after day 1 what to rank
    assert day1.measured["holdout_calls"] > 0 and day1.measured["measured_share"] == 0 and day1.saved_s == 0
    assert day1.measured["fleet_s_per_day"] > 0
    # day 2: one table; whether it wins this machine's shapes (and so how much is measured) depends on the machine:
    # the measurement's arithmetic is tests/workers/fleet/test_savings.py's
    assert day2.tables == 1 and day2.measured["fleet_s_per_day"] > 0 and day2.scale > 0
    assert 0 <= day2.own_share <= 1 and 0 <= day2.measured["measured_share"] <= 1
    assert len(day1.jobs) == 1  # the run after day 1 tuned the top task with its one unit
    assert day1.cost_s > 0  # from the job's started/finished times in the store and the run's own time
    assert day2.cost_s == 0 and not day2.jobs  # the run after the last day tunes nothing that is served
    saved, ci, cost = result.cumulative()[-1]
    assert saved == pytest.approx(day1.saved_s + day2.saved_s)
    assert ci == pytest.approx(math.hypot(day1.ci95_s, day2.ci95_s))  # independent days: variances add
    assert cost == day1.cost_s
    assert "Fleet kernel time per day" in text and "calls/day" in text and "model's own forward" in text


def _record(m: int, calls: int, served: tuple[float, ...], baseline: tuple[float, ...]) -> dict[str, object]:
    """One host's telemetry record at M, as `kernelfleet.telemetry.usage_records` writes it."""
    return {
        "workload_hash": "w" * 64,
        "target_fingerprint": "t" * 64,
        "shape": {"M": m},
        "calls": calls,
        "kernel_seconds": calls * 1e-3,
        "fallbacks": 0,
        "holdout": {
            "baseline": "torch",
            "served_calls": len(served),
            "served_s": sum(served),
            "served_s2": sum(t * t for t in served),
            "baseline_calls": len(baseline),
            "baseline_s": sum(baseline),
            "baseline_s2": sum(t * t for t in baseline),
        },
    }


def test_saving_by_route_sums_the_hosts_that_share_a_layer() -> None:
    """BERT's and GPT-2's hosts both report a layer they share: the split counts the shape's whole volume (it used to
    keep one host's record, and the routes' savings added up to less than the day's)."""
    import datetime as dt

    day = dt.date(2026, 11, 27)
    bert = _record(8, 600, (1e-3, 1.1e-3, 0.9e-3), (2e-3, 2.2e-3, 1.8e-3))
    gpt2 = _record(8, 400, (1e-3, 1.2e-3, 0.8e-3), (2e-3, 2.1e-3, 1.9e-3))
    both = fleet_sim.saving_by_route([(bert, "uKernels"), (gpt2, "uKernels")], day)["uKernels"]
    served = 1000 - 6  # the shape's calls less the held-out ones
    assert both == pytest.approx(served * 1e-3, rel=1e-6)  # the means differ by 1 ms
    split = fleet_sim.saving_by_route([(bert, "uKernels"), (gpt2, "torch")], day)
    assert split["uKernels"] + split["torch"] == pytest.approx(both, rel=0.01)
