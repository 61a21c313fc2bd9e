"""The job state machine and its leases, on real SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt

from pydantic import TypeAdapter
from sqlalchemy import update

from service.api.documents import job_view
from service.models import JobSpec, JobState, WorkloadSpec
from service.store import catalog, jobs
from service.store.db import session_scope
from service.store.tables import JobRow

SPEC = JobSpec.model_validate(
    {
        "workload": {"op": "dense", "dims": {"N": 32, "K": 32}, "symbolic": ["M"]},
        "target": {"kind": "llvm", "mcpu": "znver4", "num_cores": 2},
        "distribution": {"kind": "uniform", "dim": "M", "low": 1, "high": 8},
    }
)


def _new_job() -> str:
    with session_scope() as s:
        assert isinstance(SPEC.workload, WorkloadSpec)
        w = catalog.put_workload(s, SPEC.workload)
        return jobs.create_job(s, SPEC, w.workload_hash, queue="cpu.znver4").id


def _age_heartbeat(job_id: str, seconds: float) -> None:
    with session_scope() as s:
        s.execute(
            update(JobRow)
            .where(JobRow.id == job_id)
            .values(heartbeat_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds))
        )


def _state(job_id: str) -> JobState:
    with session_scope() as s:
        row = jobs.get_row(s, job_id)
        assert row is not None
        return JobState(row.state)


def test_claim_is_exclusive_while_the_owner_heartbeats(use_store: str) -> None:
    job_id = _new_job()
    with session_scope() as s:
        lease = jobs.claim(s, job_id, "w1", stale_after_s=30)
    assert lease and _state(job_id) is JobState.running
    with session_scope() as s:
        assert jobs.claim(s, job_id, "w2", stale_after_s=30) is None  # a redelivered copy backs off
        assert jobs.heartbeat(s, job_id, lease)
    _age_heartbeat(job_id, 60)
    with session_scope() as s:
        lease2 = jobs.claim(s, job_id, "w2", stale_after_s=30)  # the owner went silent: take over
    assert lease2 and lease2 != lease
    with session_scope() as s:
        assert not jobs.heartbeat(s, job_id, lease)  # the old owner learns it lost the job
        assert not jobs.finish(s, job_id, lease, JobState.succeeded)
        assert jobs.finish(s, job_id, lease2, JobState.succeeded)
        row = jobs.get_row(s, job_id)
        assert row is not None and row.attempts == 2
    assert _state(job_id) is JobState.succeeded


def test_reaper_requeues_then_gives_up(use_store: str) -> None:
    job_id = _new_job()
    for attempt in (1, 2):
        with session_scope() as s:
            assert jobs.claim(s, job_id, f"w{attempt}", stale_after_s=30)
        _age_heartbeat(job_id, 60)
        with session_scope() as s:
            reaped = jobs.reap_stale(s, stale_after_s=30, max_attempts=2)
        if attempt == 1:
            assert reaped.requeued == [job_id] and _state(job_id) is JobState.queued
            with session_scope() as s:
                assert jobs.undispatched(s) == [(job_id, "cpu.znver4")]
        else:
            assert reaped.failed == [job_id] and _state(job_id) is JobState.failed
    with session_scope() as s:
        row = jobs.get_row(s, job_id)
        assert row is not None and "stopped heartbeating" in (row.error or "")


def test_a_restarted_worker_releases_the_jobs_its_earlier_process_held_at_once(use_store: str) -> None:
    """Issue 34 item 7: a worker killed mid-job and started again under its node name requeues that job when it
    starts, instead of the job waiting `stale_after_s` for the reaper."""
    killed, elsewhere, renewed, spent = _new_job(), _new_job(), _new_job(), _new_job()
    with session_scope() as s:
        assert jobs.claim(s, killed, "w0@host:100", stale_after_s=60)
        assert jobs.claim(s, elsewhere, "w1@host:200", stale_after_s=60)  # another node: not this worker's
        assert jobs.claim(s, renewed, "w0@host.other:300", stale_after_s=60)  # a node name that merely starts alike
        s.execute(update(JobRow).where(JobRow.id == spent).values(attempts=2))
        assert jobs.claim(s, spent, "w0@host:100", stale_after_s=60)
    for job_id in (killed, elsewhere, renewed, spent):
        _age_heartbeat(job_id, 2)  # heartbeats a moment ago: far from stale
    started = dt.datetime.now(dt.UTC)
    with session_scope() as s:
        assert jobs.reap_stale(s, stale_after_s=60, max_attempts=3) == jobs.Reaped([], [])
        released = jobs.release_orphans(s, "w0@host", started, max_attempts=3)
    assert released == jobs.Reaped(requeued=[killed], failed=[spent])
    assert (_state(killed), _state(spent)) == (JobState.queued, JobState.failed)
    assert _state(elsewhere) is JobState.running and _state(renewed) is JobState.running
    with session_scope() as s:
        assert jobs.undispatched(s) == [(killed, "cpu.znver4")]
        row = jobs.get_row(s, killed)
        assert row is not None and "w0@host restarted" in (row.error or "")
        # a job this node claimed after it started (heartbeat newer than the start) is its own: left alone
        assert jobs.claim(s, killed, "w0@host:400", stale_after_s=60)
        assert jobs.release_orphans(s, "w0@host", started, max_attempts=3) == jobs.Reaped([], [])


def test_cancel(use_store: str) -> None:
    queued, running = _new_job(), _new_job()
    with session_scope() as s:
        lease = jobs.claim(s, running, "w", stale_after_s=30)
        assert lease
        assert jobs.request_cancel(s, queued) is JobState.cancelled
        assert jobs.request_cancel(s, running) is JobState.running
    with session_scope() as s:
        assert not jobs.heartbeat(s, running, lease)  # the worker stops at its next beat
        jobs.confirm_cancelled(s, running)
        assert jobs.claim(s, queued, "w", stale_after_s=30) is None
    assert _state(running) is JobState.cancelled
    assert _state(queued) is JobState.cancelled


def test_plan_is_persisted_once(use_store: str) -> None:
    from service.models.plan import PlannedShape

    job_id = _new_job()
    plan = [PlannedShape({"M": 8}, 0.5, 4.0, 6), PlannedShape({"M": 4}, 0.5, 2.0, 2)]
    with session_scope() as s:
        first = [r.shape_key for r in jobs.plan_shapes(s, job_id, plan)]
    with session_scope() as s:
        again = [r.shape_key for r in jobs.plan_shapes(s, job_id, plan[::-1])]
        jobs.add_progress(s, job_id, "M=8", 6)
        jobs.update_shape(s, job_id, "M=8", state=JobState.succeeded.value)
        jobs.add_progress(s, job_id, "M=4", 1)
        jobs.reset_unfinished_progress(s, job_id)
        row = jobs.get_row(s, job_id)
        assert row is not None
        view = job_view(s, row)
    assert first == again == ["M=8", "M=4"]
    assert view.trials_total == 8 and view.trials_done == 6
    assert TypeAdapter(JobState).validate_python(view.shapes[0].state) is JobState.succeeded


def _publication(job_id: str) -> tuple[bool | None, str | None]:
    with session_scope() as s:
        row = jobs.get_row(s, job_id)
        assert row is not None
        view = job_view(s, row)
        assert (view.published, view.publish_reason) == (row.published, row.publish_reason)
        return row.published, row.publish_reason


def test_a_job_that_published_nothing_says_so_and_why(use_store: str) -> None:
    held_back = _new_job()
    assert _publication(held_back) == (None, None)  # unknown until the job ends
    with session_scope() as s:
        jobs.record_publication(s, held_back, False, ["M=1: the vendor is faster as called (3.0 µs vs 9.0 µs)"])
        jobs.record_publication(s, held_back, False, ["M=8: the vendor is faster as called (4.0 µs vs 9.5 µs)"])
        jobs.finish_publication(s, held_back)
    published, reason = _publication(held_back)
    assert published is False and reason is not None
    assert reason.startswith("M=1: the vendor is faster") and "M=8: the vendor" in reason

    partly = _new_job()  # one unit published, another held back: published, with the reason for the rest
    with session_scope() as s:
        jobs.record_publication(s, partly, True)
        jobs.record_publication(s, partly, False, ["M=8: the vendor is faster as called"])
        jobs.finish_publication(s, partly)
    assert _publication(partly) == (True, "M=8: the vendor is faster as called")

    silent = _new_job()  # nothing published and no reason recorded: still not a bare "succeeded"
    with session_scope() as s:
        jobs.finish_publication(s, silent)
    assert _publication(silent) == (False, "nothing was published")
