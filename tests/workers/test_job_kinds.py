"""Job kinds are found through a registry: one defined in the test suite runs end to end, no production
module names it."""

from __future__ import annotations

import numpy as np
import pytest

from kernelfleet import InvalidRequest
from tests.helpers import Fleet, wait_for

pytestmark = pytest.mark.slow

DENSE = {"op": "dense", "dims": {"N": 32, "K": 24}, "symbolic": ["M"]}
DIST = {"kind": "explicit", "points": [{"shape": {"M": 5}, "weight": 0.7}, {"shape": {"M": 12}, "weight": 0.3}]}


def test_a_kind_registered_by_a_plugin_runs_through_api_worker_store_and_sdk(exhaustive_fleet: Fleet) -> None:
    exhaustive_fleet.start_api()
    exhaustive_fleet.start_worker("w1")
    client = exhaustive_fleet.client()
    hw = wait_for(lambda: client.workers(), 90, "a worker to announce itself")[0]["target"]
    target = {k: hw[k] for k in ("kind", "mcpu", "num_cores", "features")}

    with pytest.raises(InvalidRequest, match="multiple of 16"):  # the kind's own validation, as a 422
        client.submit({**DENSE, "dims": {"N": 30, "K": 24}}, target, DIST, kind="exhaustive")

    job = client.submit(DENSE, target, DIST, kind="exhaustive", budget={"max_shapes": 2})
    done = client.wait(job.id, timeout_s=240, poll_s=0.5)
    assert done.state == "succeeded" and done.kind == "exhaustive"
    assert done.trials_done == done.trials_total == 8  # 4 schedules × 2 shapes
    assert {s.shape["M"] for s in done.shapes} == {5, 12} and all(s.baseline for s in done.shapes)
    candidates = client._request("GET", f"/v1/jobs/{job.id}/candidates").json()
    assert len(candidates) == 8 and {c["shape_key"] for c in candidates} == {"M=5", "M=12"}

    assert done.target_fingerprint is not None
    best = client.best(done.workload_hash, done.target_fingerprint, {"M": 12})
    assert best is not None and best.kind == "exhaustive" and best.provenance["tuner"] == "exhaustive"
    kernel = client.kernel(done.workload_hash, done.target_fingerprint, {"M": 12})
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((12, 24), np.float32), rng.standard_normal((32, 24), np.float32)
    np.testing.assert_allclose(kernel(x, w), x @ w.T, rtol=1e-4, atol=1e-4)


def test_without_the_plugin_the_kind_is_unknown_and_the_error_names_the_known_ones(exhaustive_fleet: Fleet) -> None:
    exhaustive_fleet.env.pop("KERNELFLEET_PLUGINS")
    exhaustive_fleet.start_api()
    client = exhaustive_fleet.client()
    target = {"kind": "llvm", "mcpu": "znver4", "num_cores": 1}
    with pytest.raises(InvalidRequest) as err:
        client.submit(DENSE, target, DIST, kind="exhaustive")
    assert "unknown job kind 'exhaustive'" in str(err.value) and "sketch" in str(err.value)
