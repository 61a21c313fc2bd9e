"""Workers keep `last_seen` current; a job no live worker serves says so, then fails after a deadline; `mcpu:
host` names what the live workers serve. Real API, Celery worker and beat over PostgreSQL and Redis."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelfleet import InvalidRequest, JobFailed
from tests.helpers import Fleet, wait_for

pytestmark = pytest.mark.slow

DENSE = {"op": "dense", "dims": {"N": 32, "K": 24}, "symbolic": ["M"]}
DIST = {"kind": "explicit", "points": [{"shape": {"M": 5}, "weight": 1.0}]}


@pytest.fixture
def fleet(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[Fleet]:
    env = {
        "KERNELFLEET_DATABASE_URL": pg_url,
        "KERNELFLEET_BROKER_URL": redis_url,
        "KERNELFLEET_HEARTBEAT_INTERVAL_S": "1",
        "KERNELFLEET_WORKER_STALE_AFTER_S": "5",
        "KERNELFLEET_NO_WORKER_DEADLINE_S": "8",
        "KERNELFLEET_REAP_INTERVAL_S": "1",
    }
    fleet = Fleet(tmp_path / "fleet", env)
    yield fleet
    fleet.stop()


def _cli(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**fleet.env, "KERNELFLEET_URL": fleet.url, "KERNELFLEET_API_KEY": fleet.api_key or ""}
    code = "from kernelfleet.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=60)


def test_live_workers_unserved_jobs_and_the_host_alias(fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    fleet.start_api()
    fleet.start_beat()
    client = fleet.client()

    # no worker yet: 'host' names nothing, and a job for any target waits, visibly
    with pytest.raises(InvalidRequest, match="no live worker serves a llvm target"):
        client.submit(DENSE, {"kind": "llvm", "mcpu": "host"}, DIST)
    fleet.start_worker("w1")
    workers = wait_for(lambda: client.workers(), 90, "a worker to announce itself")
    assert workers[0]["online"] is True
    first_seen = workers[0]["last_seen"]
    wait_for(lambda: client.workers()[0]["last_seen"] != first_seen, 10, "a presence heartbeat")

    served = client.targets()
    assert len(served) == 1 and served[0].kind == "llvm"
    assert served[0].mcpu and served[0].mcpu in _cli(fleet, "targets").stdout

    # the alias resolves to the served target; the job's queue has a worker
    job = client.submit(DENSE, {"kind": "llvm", "mcpu": "host"}, DIST, budget={"trials": 4})
    assert job.target["mcpu"] == served[0].mcpu and job.waiting_for_worker is None
    client.cancel(job.id)

    # a CPU model no worker here has: the view names the queue, wait() says so, then the deadline fails it
    other = next(m for m in ("znver5", "znver3", "skylake-avx512") if m != served[0].mcpu)
    unserved = client.submit(DENSE, {"kind": "llvm", "mcpu": other, "num_cores": 2}, DIST)
    assert unserved.waiting_for_worker == f"cpu.{other}"
    assert "waiting for a worker" in _cli(fleet, "job", unserved.id).stdout
    with caplog.at_level(logging.WARNING, logger="kernelfleet"), pytest.raises(JobFailed) as failed:
        client.wait(unserved.id, timeout_s=60, poll_s=0.5)
    assert f"no live worker consumes queue 'cpu.{other}'" in str(failed.value)
    assert any("waiting for a worker" in r.getMessage() for r in caplog.records)

    # a worker that stops heartbeating goes offline and stops counting as live
    fleet.kill("w1")
    wait_for(lambda: not client.workers()[0]["online"], 30, "the killed worker to go offline")
    assert all(not w["online"] for w in client.status()["workers"])
    assert "offline" in _cli(fleet, "status").stdout
    assert client.targets() == []
    with pytest.raises(InvalidRequest, match="no live worker"):
        client.submit(DENSE, {"kind": "llvm", "mcpu": "host"}, DIST)
