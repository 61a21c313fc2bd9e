"""The fleet loop on real parts: a synthetic week of telemetry through the API, the daily run on a real worker
with a tiny budget (ranking, budget, jobs, idempotence, report arithmetic), then the next day's run."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelfleet import Client, cli
from tests.helpers import Fleet, wait_for

pytestmark = pytest.mark.slow

BIG = {"op": "dense", "dims": {"N": 64, "K": 32}, "symbolic": ["M"]}  # ukernel-able
# sketch only: ukernel jobs take exactly one dynamic dim (M), and since epilogues they take a bias too
SMALL = {"op": "dense", "dims": {"K": 32}, "symbolic": ["M", "N"], "attrs": {"bias": True}}
ENV = {
    "KERNELFLEET_FLEET_DAILY_TRIALS": "32",
    "KERNELFLEET_FLEET_UNIT_TRIALS": "8",
    "KERNELFLEET_FLEET_REMEASURE_SAMPLE": "1",
    # SMALL's shapes are too small to beat numpy as the SDK calls it; this test checks the loop's mechanics
    "KERNELFLEET_PUBLISH_ONLY_FASTER_THAN_VENDOR": "false",
    "KERNELFLEET_UKERNEL_VENDOR_ROUTES": "false",  # and so is BIG: its table keeps every M on uKernels
}


@pytest.fixture
def fleet(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path / "fleet", {"KERNELFLEET_DATABASE_URL": pg_url, "KERNELFLEET_BROKER_URL": redis_url, **ENV})
    yield fleet
    fleet.stop()


def _week(run_day: dt.date, big: str, small: str, fp: str) -> list[dict[str, object]]:
    """The seven days before `run_day`: BIG spread over M = 1..40 (100 s/day), SMALL at M = 8 and 13 (10 s/day,
    all misses)."""
    records = []
    for back in range(1, 8):
        day = (run_day - dt.timedelta(days=back)).isoformat()
        weights = {m: 1 / m for m in range(1, 41)}
        total = sum(weights.values())
        for m, w in weights.items():
            calls = 1000 * m
            records.append(
                {"workload_hash": big, "target_fingerprint": fp, "shape": {"M": m}, "calls": calls,
                 "kernel_seconds": 100 * w / total, "fallbacks": calls, "day": day}
            )  # fmt: skip
        for m in (8, 13):
            records.append(
                {"workload_hash": small, "target_fingerprint": fp, "shape": {"M": m, "N": 32}, "calls": 500,
                 "kernel_seconds": 5.0, "fallbacks": 500, "day": day}
            )  # fmt: skip
    return records


def _report(client: Client, day: dt.date) -> dict[str, object] | None:
    return next((r for r in client.fleet_reports() if r["day"] == day.isoformat() and r["state"] != "running"), None)


def test_daily_run_ranks_budgets_submits_and_runs_once_a_day(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet.start_api()
    fleet.start_worker("w1")
    client = fleet.client()
    hw = wait_for(lambda: client.workers(), 90, "a worker to announce itself")[0]
    target = client.register_target({k: hw["target"][k] for k in ("kind", "mcpu", "num_cores", "features")})
    fp = target.target_fingerprint
    big, small = client.register_workload(BIG).workload_hash, client.register_workload(SMALL).workload_hash
    # the first run is yesterday's and the second day1's: the API refuses runs for future days
    day1 = dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)
    day2 = day1 + dt.timedelta(days=1)
    assert (
        client._http.post("/v1/fleet/runs", json={"day": (day2 + dt.timedelta(days=1)).isoformat()}).status_code == 422
    )

    records = _week(day1, big, small, fp)
    batch = {"batch_id": str(uuid.uuid4()), "host": "replay", "records": records}
    assert client.send_telemetry(batch) == {"batch_id": batch["batch_id"], "accepted": len(records), "duplicate": False}
    assert client.send_telemetry(batch)["duplicate"] is True  # resent: counted once
    usage = client.fleet_usage(days=9, limit=1000)
    assert math.isclose(usage["total_seconds"], 7 * 110, rel_tol=1e-6)
    assert {r["workload_hash"] for r in usage["rows"]} == {big, small}

    client.run_fleet(day1.isoformat())
    report = wait_for(lambda: _report(client, day1), 120, "the daily report")
    assert report["state"] == "done", report.get("error")
    assert math.isclose(report["fleet_seconds_per_day"], 110, rel_tol=1e-6)
    cands = report["candidates"]
    assert [c["workload_hash"] for c in cands] == [big, small]  # ranked by expected saving per day
    for c in cands:
        assert set(c["reasons"]) >= {"untuned", "fallback"}
        assert math.isclose(c["observed_s_per_day"], sum(c["shapes"].values()), rel_tol=1e-9)
        assert math.isclose(c["expected_saving_s_per_day"], c["observed_s_per_day"] * c["predicted_gain"], rel_tol=1e-9)
    assert cands[0]["kind"] == "ukernel" and cands[1]["kind"] == "sketch"
    # named as people read them (issue 35 item 6), per observed day
    assert [c["label"] for c in cands] == ["dense M=? N=64 K=32", "dense M=? N=? K=32 +bias"]
    assert report["observed_days"] == 7
    monkeypatch.setattr(cli.console, "_width", 200)  # a wide terminal: the table cells stay on one line
    printed = CliRunner().invoke(cli.app, ["fleet", "report", "--url", fleet.url],
                                 env={"KERNELFLEET_API_KEY": fleet.api_key or ""})  # fmt: skip
    assert printed.exit_code == 0 and "dense M=? N=64 K=32" in printed.output, printed.output
    assert "over 7 observed days (window 7 days)" in printed.output
    queue = cands[0]["queue"]
    assert report["budget"] == {queue: 32} and 0 < report["spent"][queue] <= 32
    assert cands[0]["trials"] == 8 and cands[1]["trials"] % 8 == 0 and cands[1]["trials"] > 0
    assert report["spent"][queue] == cands[0]["trials"] + cands[1]["trials"]  # what the jobs were given
    # no fleet job has run yet: a unit is priced at the prior, and the plan's worker seconds follow from the units
    assert report["unit_s"] == {queue: 60.0} and report["budget_s"] == {queue: 3600.0}
    assert report["planned_s"][queue] == 60.0 * (cands[0]["units"] + cands[1]["units"])
    submitted = [c for c in cands if c["job_id"]]
    assert math.isclose(report["expected_saving_s_per_day"], sum(c["expected_saving_s_per_day"] for c in submitted))

    jobs = {c["job_id"]: client.wait(c["job_id"], timeout_s=300, poll_s=0.5) for c in submitted}
    assert all(j.tags["fleet_run"] == day1.isoformat() and j.state == "succeeded" for j in jobs.values())
    assert jobs[cands[0]["job_id"]].kind == "ukernel"

    # the same day again (a second beat, a restart): nothing new
    client.run_fleet(day1.isoformat())
    wait_for(lambda: "fleet run" in fleet.log("w1") and "already exists" in fleet.log("w1"), 60, "the rerun to no-op")
    assert len([r for r in client.fleet_reports() if r["day"] == day1.isoformat()]) == 1
    assert len(client.jobs(limit=100)) == len(jobs)

    # the next day: both tasks are tuned now, so nothing is left to rank; yesterday's jobs count in the cost
    client.run_fleet(day2.isoformat())
    second = wait_for(lambda: _report(client, day2), 120, "the next day's report")
    assert second["state"] == "done" and second["candidates"] == [] and second["expected_saving_s_per_day"] == 0
    assert second["modelled"]["jobs"] == 2 and second["cost"]["tuning_s"] > 0
    assert second["cost"]["jobs_by_state"] == {"succeeded": 2}
    assert second["cost"]["cpu_s"] > 0  # each attempt's CPU seconds, recorded by the worker as the attempt ended
    # no host held calls out this week: nothing is measured, so nothing is claimed
    assert second["measured"]["saved_s_per_day"] == 0 and second["measured"]["measured_share"] == 0
    assert second["remeasured"] == 1  # SMALL's sketch configs are on this worker's hardware
