"""A gemmini job end to end: API → Redis → a worker serving the `firesim` queue with the zigzag backend →
store, read back through the SDK."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Fleet, wait_for

pytestmark = pytest.mark.slow

LAYERS = {
    "kind": "explicit",
    "points": [
        {"shape": {"M": 128, "N": 256, "K": 256}, "weight": 4},
        {"shape": {"M": 1, "N": 512, "K": 512}, "weight": 1},
    ],
}


@pytest.fixture
def fleet(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[Fleet]:
    env = {
        "KERNELFLEET_DATABASE_URL": pg_url,
        "KERNELFLEET_BROKER_URL": redis_url,
        "KERNELFLEET_WORKER_PLATFORM": "gemmini",
        "KERNELFLEET_GEMMINI_BACKEND": "zigzag",
        "KERNELFLEET_WORKER_QUEUES": "firesim,control",  # as docker-compose's worker-firesim
    }
    fleet = Fleet(tmp_path / "fleet", env)
    yield fleet
    fleet.stop()


def test_gemmini_job_runs_on_a_firesim_queue_worker_with_zigzag(fleet: Fleet) -> None:
    fleet.start_api()
    fleet.start_worker("g1")
    client = fleet.client()
    hw = wait_for(lambda: client.workers(), 90, "the gemmini worker to announce itself")[0]["target"]
    assert hw["kind"] == "gemmini" and hw["details"]["backend"] == "zigzag"
    workload = {"op": "dense", "symbolic": ["M", "N", "K"]}
    job = client.submit(
        workload, {"kind": "gemmini", "arch": "default"}, LAYERS, kind="gemmini", budget={"trials": 600, "seed": 1}
    )
    done = client.wait(job.id, timeout_s=180, poll_s=0.5)
    assert done.state == "succeeded", done
    assert len(done.shapes) == 2
    assert done.trials_done == done.trials_total == 600 + 4
    candidates = client._request("GET", f"/v1/jobs/{job.id}/candidates").json()
    measured = [c for c in candidates if c["config"]["role"] != "explored"]
    assert {c["config"]["backend"] for c in measured} == {"zigzag"}
    assert {c["config"]["backend"] for c in candidates if c not in measured} == {"model"}  # never a backend's
    assert done.target_fingerprint is not None
    best = client.best(done.workload_hash, done.target_fingerprint, {"M": 128, "N": 256, "K": 256})
    assert best is not None and best.provenance["backend"] == "zigzag"
    assert best.provenance["calibration"]["backend"] == "zigzag"
