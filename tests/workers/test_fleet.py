"""The whole service as real processes: API, Celery workers (and beat), real stores and brokers, real TVM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kernelfleet import Client, Job
from service.workers import scratch
from tests.helpers import TINY_DENSE, Fleet, free_port, wait_for

pytestmark = pytest.mark.slow

DIST = {"kind": "explicit", "points": [{"shape": {"M": 13}, "weight": 1}, {"shape": {"M": 8}, "weight": 1}]}

# The tests of the fleet's mechanics (redelivery, reaping, cancel, broker outages) are not about the search:
# their jobs run the test suite's `exhaustive` kind (a plugin: real TVM builds of a fixed list of schedules,
# about half a second per candidate) instead of MetaSchedule, whose fixed cost per job is 15-20 s here. The
# sketch search through the whole fleet is test_flow_api_worker_store_sdk_on_postgres_and_redis's.
REPO = Path(__file__).resolve().parents[2]
EXHAUSTIVE = {"KERNELFLEET_PLUGINS": "tests.workers.exhaustive_kind"}
FOUR_SHAPES = {"kind": "explicit", "points": [{"shape": {"M": m}} for m in (5, 8, 13, 21)]}  # 16 candidates


@pytest.fixture
def fleet_factory(tmp_path: Path) -> Iterator[object]:
    fleets: list[Fleet] = []

    def make(**env: str) -> Fleet:
        # these tests check publication mechanics on shapes too small for a tuned kernel to beat numpy as the SDK
        # calls it, so they publish regardless; test_only_configs_faster_than_the_vendor_are_served checks the default
        env = {"KERNELFLEET_PUBLISH_ONLY_FASTER_THAN_VENDOR": "false", **env}
        fleet = Fleet(tmp_path / f"fleet{len(fleets)}", {k: str(v) for k, v in env.items()})
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.stop()


def _target(client: Client) -> dict[str, object]:
    hw = wait_for(lambda: client.workers(), 90, "a worker to announce itself")[0]["target"]
    return {k: hw[k] for k in ("kind", "mcpu", "num_cores", "features")}


def _running_with_progress(client: Client, job_id: str) -> Job | None:
    job = client.job(job_id)
    return job if job.state == "running" and job.trials_done > 0 else None


def test_flow_api_worker_store_sdk_on_postgres_and_redis(fleet_factory, pg_url: str, redis_url: str) -> None:  # type: ignore[no-untyped-def]
    fleet = fleet_factory(KERNELFLEET_DATABASE_URL=pg_url, KERNELFLEET_BROKER_URL=redis_url)
    fleet.start_api()
    fleet.start_worker("w1")
    client = fleet.client()
    job = client.submit(TINY_DENSE, _target(client), DIST, budget={"trials": 16, "max_shapes": 2, "seed": 0})
    done = client.wait(job.id, timeout_s=300, poll_s=0.5)
    assert done.state == "succeeded" and done.trials_done == done.trials_total == 16
    assert {s.shape["M"] for s in done.shapes} == {8, 13}
    for s in done.shapes:
        assert s.state == "succeeded" and s.best_latency_s and s.baseline_latency_s and "numpy" in (s.baseline or "")
    candidates = client._request("GET", f"/v1/jobs/{job.id}/candidates", params={"limit": 1000}).json()
    assert len(candidates) == 16 and all(c["status"] in ("ok", "error", "timeout") for c in candidates)

    assert done.target_fingerprint
    best = client.best(done.workload_hash, done.target_fingerprint, {"M": 13})
    assert best is not None and best.job_id == job.id and best.provenance["tuner"] == "sketch"
    kernel = client.kernel(done.workload_hash, done.target_fingerprint, {"M": 13})
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((13, 32)).astype("float32"), rng.standard_normal((32, 32)).astype("float32")
    np.testing.assert_allclose(kernel(x, w), x @ w.T, rtol=1e-4, atol=1e-4)
    # misses: an untuned shape, and the same hardware with another toolchain
    assert client.best(done.workload_hash, done.target_fingerprint, {"M": 9}) is None
    other = client.register_target({**done.target, "toolchain": {"tvm": "0.26.0"}})
    assert client.best(done.workload_hash, other.target_fingerprint, {"M": 13}) is None


def test_worker_sigkill_on_redis_is_redelivered(fleet_factory, pg_url: str, redis_url: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    temp = tmp_path / "tmp"  # the workers' temp dir, where each job attempt has a directory
    temp.mkdir()
    fleet = fleet_factory(
        KERNELFLEET_DATABASE_URL=pg_url,
        KERNELFLEET_BROKER_URL=redis_url,
        KERNELFLEET_BROKER_VISIBILITY_TIMEOUT_S="8",
        KERNELFLEET_BROKER_UNACKED_RESTORE_INTERVAL_S="1",
        KERNELFLEET_HEARTBEAT_INTERVAL_S="1",
        KERNELFLEET_STALE_AFTER_S="4",
        TMPDIR=str(temp),
        **EXHAUSTIVE,
    )
    fleet.start_api()
    fleet.start_worker("victim")
    client = fleet.client()
    job = client.submit(TINY_DENSE, _target(client), FOUR_SHAPES, kind="exhaustive", budget={"max_shapes": 4})
    wait_for(lambda: _running_with_progress(client, job.id), 180, "the job to be mid-run", poll_s=0.1)
    fleet.kill("victim")  # SIGKILL the worker and its measurement processes
    attempts = temp / scratch.ROOT_NAME  # <fleet>/<node>/<job id>.<lease> under it
    assert list(attempts.glob(f"*/victim@*/{job.id}.*"))  # what the killed attempt leaves...
    fleet.start_worker("rescuer")  # no beat: recovery must come from the broker's redelivery
    done = client.wait(job.id, timeout_s=300, poll_s=0.5)
    assert done.state == "succeeded" and done.attempts == 2
    assert all(s.state == "succeeded" for s in done.shapes)
    assert "rescuer" in (done.worker or "")
    assert len(client.configs(workload=done.workload_hash)) == 4  # one best per shape, no duplicates
    assert not list(attempts.glob(f"*/*/{job.id}.*"))  # ...the rescuing attempt removed, and its own too


def test_worker_sigkill_on_embedded_broker_is_reaped(fleet_factory) -> None:  # type: ignore[no-untyped-def]
    fleet = fleet_factory(
        KERNELFLEET_HEARTBEAT_INTERVAL_S="1",
        KERNELFLEET_STALE_AFTER_S="4",
        KERNELFLEET_REAP_INTERVAL_S="2",
        **EXHAUSTIVE,
    )
    fleet.start_api()
    fleet.start_beat()
    fleet.start_worker("victim")
    client = fleet.client()
    job = client.submit(TINY_DENSE, _target(client), FOUR_SHAPES, kind="exhaustive", budget={"max_shapes": 4})
    wait_for(lambda: _running_with_progress(client, job.id), 180, "the job to be mid-run", poll_s=0.1)
    fleet.kill("victim")  # the SQLite transport never redelivers: the store's reaper must
    fleet.start_worker("rescuer")
    done = client.wait(job.id, timeout_s=300, poll_s=0.5)
    assert done.state == "succeeded" and done.attempts == 2
    assert "reaper: requeued" in fleet.log("rescuer")  # the beat-scheduled reaper, run on the surviving worker
    status = client.status()
    assert status["jobs"]["succeeded"] == 1 and status["trials_per_second"] > 0


def test_standalone_runs_a_job_on_the_embedded_default_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELFLEET_")}
    env["KERNELFLEET_DATA_DIR"] = str(tmp_path / "data")
    # its parts inherit the environment, plugins included; a console script has no cwd on its path
    env.update(EXHAUSTIVE, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    cli = Path(sys.executable).parent / "kernelfleet"
    proc = subprocess.Popen(
        [str(cli), "standalone", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        key_file = tmp_path / "data" / "admin.key"
        wait_for(key_file.exists, 90, "standalone to create the first admin key")
        client = Client(f"http://127.0.0.1:{port}", retries=6, api_key=key_file.read_text().strip())
        wait_for(client.health, 90, "standalone to become ready")
        job = client.submit(
            TINY_DENSE,
            _target(client),
            {"kind": "uniform", "dim": "M", "low": 4, "high": 6},
            kind="exhaustive",
            budget={"max_shapes": 1},
        )
        assert client.wait(job.id, timeout_s=300, poll_s=0.5).state == "succeeded"
        assert (tmp_path / "data" / "kernelfleet.db").exists() and (tmp_path / "data" / "broker.db").exists()
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out.decode(errors="replace")[-2000:]
    assert out.decode().count("admin API key (shown once") == 1
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert not leftover, f"processes left running: {leftover}"


class PrivateRedis:
    """A redis-server of the test's own, with AOF, so it can be restarted without touching the shared one."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir, self.port = data_dir, free_port()
        data_dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.data_dir),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(
            lambda: subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True).stdout.startswith(
                b"PONG"
            ),
            20,
            "redis to start",
        )

    def restart(self) -> None:
        assert self.proc is not None
        self.proc.terminate()  # SIGTERM: redis fsyncs the AOF and exits
        self.proc.wait(20)
        self.start()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


def test_redis_restart_loses_no_job(fleet_factory, pg_url: str, private_redis: PrivateRedis) -> None:  # type: ignore[no-untyped-def]
    fleet = fleet_factory(
        KERNELFLEET_DATABASE_URL=pg_url,
        KERNELFLEET_BROKER_URL=private_redis.url,
        KERNELFLEET_BROKER_VISIBILITY_TIMEOUT_S="8",
        KERNELFLEET_BROKER_UNACKED_RESTORE_INTERVAL_S="1",
        KERNELFLEET_HEARTBEAT_INTERVAL_S="1",
        KERNELFLEET_STALE_AFTER_S="4",
        **EXHAUSTIVE,
    )
    fleet.start_api()
    client = fleet.client()
    hw = __import__("service.tuning.hardware", fromlist=["host_target"]).host_target()
    target = hw.model_dump(exclude={"toolchain", "arch"})
    ids = [
        client.submit(
            TINY_DENSE,
            target,
            {"kind": "explicit", "points": [{"shape": {"M": m}}]},
            kind="exhaustive",
            budget={"max_shapes": 1},
        ).id
        for m in (3, 5, 7)
    ]
    private_redis.restart()  # with every job still queued in the broker
    fleet.start_worker("w1")
    wait_for(lambda: client.job(ids[0]).state != "queued", 120, "the first job to start")
    private_redis.restart()  # again, while the worker runs a job
    for job_id in ids:
        assert client.wait(job_id, timeout_s=300, poll_s=0.5).state == "succeeded"


def test_cancel_stops_a_running_job(fleet_factory) -> None:  # type: ignore[no-untyped-def]
    fleet = fleet_factory(KERNELFLEET_HEARTBEAT_INTERVAL_S="1", **EXHAUSTIVE)
    fleet.start_api()
    fleet.start_worker("w1")
    client = fleet.client()
    many = {"kind": "explicit", "points": [{"shape": {"M": m}} for m in range(1, 17)]}  # 64 candidates
    job = client.submit(TINY_DENSE, _target(client), many, kind="exhaustive", budget={"max_shapes": 16})
    wait_for(lambda: _running_with_progress(client, job.id), 180, "the job to be mid-run", poll_s=0.1)
    assert client.cancel(job.id).state == "running"  # a running job stops at its next heartbeat
    done = client.wait(job.id, timeout_s=120, poll_s=0.5, raise_on_failure=False)
    assert done.state == "cancelled" and done.trials_done < done.trials_total == 64
    # the store says cancelled when the runner confirms it; the task logs its outcome just after
    wait_for(lambda: "outcome: cancelled" in fleet.log("w1"), 30, "the worker to log the cancelled outcome")


def test_job_accepted_while_the_broker_is_down_is_dispatched_later(  # type: ignore[no-untyped-def]
    fleet_factory, pg_url: str, private_redis: PrivateRedis
) -> None:
    fleet = fleet_factory(
        KERNELFLEET_DATABASE_URL=pg_url,
        KERNELFLEET_BROKER_URL=private_redis.url,
        KERNELFLEET_REAP_INTERVAL_S="2",
        **EXHAUSTIVE,
    )
    fleet.start_api()
    client = fleet.client()
    hw = __import__("service.tuning.hardware", fromlist=["host_target"]).host_target()
    target = hw.model_dump(exclude={"toolchain", "arch"})
    private_redis.stop()  # the broker is gone: the API must still accept and keep the job
    job = client.submit(TINY_DENSE, target, {"kind": "explicit", "points": [{"shape": {"M": 4}}]}, kind="exhaustive")
    assert job.state == "queued"
    private_redis.start()
    fleet.start_beat()  # the reaper publishes jobs whose message was never sent
    fleet.start_worker("w1")
    assert client.wait(job.id, timeout_s=300, poll_s=0.5).state == "succeeded"
    assert f"dispatched ['{job.id}']" in fleet.log("w1")  # it went through the reaper, not a lucky publish


def test_only_configs_faster_than_the_vendor_are_served(fleet_factory, pg_url: str, redis_url: str) -> None:  # type: ignore[no-untyped-def]
    fleet = fleet_factory(
        KERNELFLEET_DATABASE_URL=pg_url,
        KERNELFLEET_BROKER_URL=redis_url,
        KERNELFLEET_PUBLISH_ONLY_FASTER_THAN_VENDOR="true",
    )
    fleet.start_api()
    fleet.start_worker("w1")
    client = fleet.client()
    job = client.submit(TINY_DENSE, _target(client), DIST, budget={"trials": 8, "max_shapes": 2, "seed": 0})
    done = client.wait(job.id, timeout_s=300, poll_s=0.5)
    assert done.state == "succeeded" and done.target_fingerprint
    for s in done.shapes:  # both latencies are as an inference host calls them, so they decide what is served
        assert s.best_latency_s and s.baseline_latency_s
        served = client.best(done.workload_hash, done.target_fingerprint, s.shape)
        assert (served is not None) == (s.best_latency_s < s.baseline_latency_s), (s, served)
