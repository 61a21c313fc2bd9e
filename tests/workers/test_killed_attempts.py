"""A worker killed mid-job leaves no debris (issue 34 item 7).

The job was `running` for 73 s after a SIGKILL (until the reaper found its heartbeat stale), its shape was tuned
again from 0 (48 candidates for 32 trials) and the killed attempt's temporary directory stayed on disk. Now a
worker started again under its node name requeues its earlier process's jobs as it starts, a sketch retry searches
on from the candidates the killed attempt stored (one budget across attempts), and each attempt works under a
directory the next one (or the worker's next start) removes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.workers import scratch
from tests.helpers import TINY_DENSE, Fleet, wait_for
from tests.workers.test_fleet import _target

# about 5 minutes on a quiet 2-core machine (two worker starts, two MetaSchedule rounds): `make test-soak`;
# make test keeps the resume logic (tests/tuning/test_sketch_resume.py), the sweeps (tests/workers/test_scratch.py),
# release_orphans (tests/store/test_jobs.py) and the SIGKILL redelivery with its dir check (tests/workers/test_fleet.py)
pytestmark = [pytest.mark.slow, pytest.mark.soak]

TRIALS = 16  # two MetaSchedule rounds of 8 (service.tuning.tuners.sketch._batch_size)


def test_a_worker_killed_mid_job_is_resumed_at_its_restart_from_the_stored_candidates(
    tmp_path: Path, pg_url: str, redis_url: str
) -> None:
    temp = tmp_path / "tmp"  # the workers' system temp dir: where their work directories live
    temp.mkdir()
    env = {
        "KERNELFLEET_DATABASE_URL": pg_url,
        "KERNELFLEET_BROKER_URL": redis_url,
        "KERNELFLEET_PUBLISH_ONLY_FASTER_THAN_VENDOR": "false",  # a tiny layer: publish whatever verified
        "TMPDIR": str(temp),
    }
    # Default heartbeat, staleness and visibility timeout, and no beat: no reaper and no broker redelivery within
    # the test. Only the restarted worker itself can give the job back.
    fleet = Fleet(tmp_path / "fleet", env)
    try:
        fleet.start_api()
        fleet.start_worker("victim")
        client = fleet.client()
        one_shape = {"kind": "explicit", "points": [{"shape": {"M": 13}}]}
        job = client.submit(TINY_DENSE, _target(client), one_shape, budget={"trials": TRIALS, "seed": 0})

        def candidates() -> list[dict[str, object]]:
            found: list[dict[str, object]] = client._request(
                "GET", f"/v1/jobs/{job.id}/candidates", params={"limit": 1000}
            ).json()
            return found

        before = wait_for(lambda: candidates() or None, 300, "a first measured round", poll_s=0.1)
        fleet.kill("victim")  # SIGKILL, its measuring processes with it
        assert client.job(job.id).state == "running"
        root = temp / scratch.ROOT_NAME  # <fleet>/<node>/<job id>.<lease> under it
        assert list(root.glob(f"*/victim@*/{job.id}.*")), (
            f"no attempt directory where expected: {list(temp.rglob('*'))}"
        )

        fleet.start_worker("victim")
        # the worker's start gives the job back: neither the reaper (no beat) nor Redis (visibility timeout 3600 s)
        wait_for(lambda: client.job(job.id).attempts == 2, 180, "the restarted worker to take the job back")
        done = client.wait(job.id, timeout_s=600, poll_s=0.5)

        assert done.state == "succeeded" and done.attempts == 2, done.error
        # one budget across both attempts: what the killed one measured counts, and is not measured again
        assert done.trials_done == done.trials_total == TRIALS
        assert [s.trials_done for s in done.shapes] == [TRIALS]
        after = candidates()
        assert len(after) == TRIALS
        assert len({str(c["config"]) for c in after}) == TRIALS  # no schedule measured twice
        log = fleet.log("victim")
        resumed = re.search(r"resuming M=13 from (\d+) measured candidates", log)
        assert resumed and int(resumed.group(1)) >= len(before), log[-3000:]
        assert re.search(rf"jobs of an earlier victim@\S+: requeued \['{job.id}'\]", log), log[-3000:]
        assert re.search(r"removed \d+ leftovers of an earlier worker named victim@", log), log[-3000:]
        # no directory of either attempt is left: only the running worker's own temp dir
        (fleet_dir,) = root.iterdir()
        (node,) = fleet_dir.iterdir()
        assert [p.name for p in node.iterdir()] == ["tmp"], list(node.rglob("*"))
    finally:
        fleet.stop()
