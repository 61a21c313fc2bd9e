"""Celery tasks: thin wrappers around the Celery-free job runner and reaper."""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
from typing import Any

from celery.signals import setup_logging, worker_ready

from kernelfleet.tvm_runtime import preload_cuda_runtime
from service.logs import for_job
from service.settings import get_settings
from service.store import catalog, jobs
from service.store.db import session_scope
from service.store.tables import utcnow
from service.tuning import hardware

hardware.pin_tvm_threads()  # before numpy (the platforms import it) and any TVM import in this worker
preload_cuda_runtime()  # GPU workers: the wheels' libcudart, without which TVM's CUDA plugin does not load

from service.tuning.platforms import host_platform  # noqa: E402
from service.workers import scratch  # noqa: E402
from service.workers.celery_app import CONTROL_QUEUE, FLEET_DAILY, REAP, RUN_JOB, app, enqueue  # noqa: E402

log = logging.getLogger(__name__)

# Before this process could run anything: a job of this worker's node name last renewed earlier is an earlier
# process's (service.store.jobs.release_orphans).
_PROCESS_STARTED = utcnow()


def worker_id(node: str | None = None) -> str:
    """The Celery node name (e.g. `worker0@host`) plus the pid, unique across restarts."""
    return f"{node or socket.gethostname()}:{os.getpid()}"


@app.task(name=RUN_JOB, bind=True)
def run_job(self: Any, job_id: str) -> str:
    from service.workers.job_runner import run_job as run

    settings = get_settings()
    outcome = run(job_id, worker_id(self.request.hostname), settings)
    for_job(log, job_id).info("outcome: %s", outcome)
    if outcome == "busy":
        # A redelivered copy found the job running elsewhere. Acking it would leave no message should that
        # worker die, so check again once its heartbeat could have gone stale.
        queue = (self.request.delivery_info or {}).get("routing_key") or CONTROL_QUEUE
        app.send_task(RUN_JOB, args=[job_id], queue=queue, countdown=settings.stale_after_s + 1)
    return outcome


@app.task(name=REAP)
def reap() -> dict[str, list[str]]:
    """Requeue jobs whose worker died (the SQLite broker never redelivers) and enqueue undispatched ones."""
    settings = get_settings()
    with session_scope() as s:
        reaped = jobs.reap_stale(s, settings.stale_after_s, settings.max_attempts)
        unserved = jobs.fail_unserved(
            s, catalog.live_queues(s, settings.worker_stale_after_s), settings.no_worker_deadline_s
        )
    sent = _dispatch_queued()
    if reaped.requeued or reaped.failed or unserved or sent:
        log.warning(
            "reaper: requeued %s, failed %s, no worker for %s, dispatched %s",
            reaped.requeued,
            reaped.failed,
            unserved,
            sent,
        )
    return {"requeued": reaped.requeued, "failed": reaped.failed + unserved, "dispatched": sent}


def _dispatch_queued() -> list[str]:
    """Publish the queued jobs whose message was never sent or must be sent again (requeued); their ids."""
    with session_scope() as s:
        pending = jobs.undispatched(s)
    for job_id, queue in pending:
        enqueue(job_id, queue)
        with session_scope() as s:
            jobs.mark_dispatched(s, job_id)
    return [job_id for job_id, _ in pending]


@app.task(name=FLEET_DAILY)
def fleet_daily(day: str | None = None) -> dict[str, Any]:
    """The daily fleet run for `day` (ISO date; default today, UTC). A day that already ran does nothing."""
    from service.workers.fleet.daily import run_daily

    when = dt.date.fromisoformat(day) if day else dt.datetime.now(dt.UTC).date()
    report = run_daily(when, get_settings(), host_platform()[1].fingerprint)
    if report is None:
        return {"day": when.isoformat(), "ran": False}
    log.info("fleet run %s: %s, %d candidates, %s", when, report.state, len(report.candidates), report.error or "")
    return {"day": when.isoformat(), "ran": True, "state": report.state}


@setup_logging.connect
def _logging(**_: Any) -> None:
    """Our format (JSON with KERNELFLEET_LOG_FORMAT=json) instead of Celery's."""
    from service import logs

    logs.configure()


@worker_ready.connect
def _announce(sender: Any = None, **_: Any) -> None:
    """Record which hardware this worker tunes for, so users can pick a target the fleet can serve."""
    queues = sorted(q.name for q in sender.app.amqp.queues.consume_from.values()) if sender else [CONTROL_QUEUE]
    name = worker_id(getattr(sender, "hostname", None))
    settings = get_settings()
    # What an earlier process of this node name left when it was killed: its files, and its jobs, which it can
    # no longer run. Before any task runs here (the solo pool runs tasks on this thread, after this signal).
    scratch.take_over_node(settings, name)
    node = scratch.node_of(name)
    with session_scope() as s:
        catalog.announce_worker(s, name, queues, host_platform()[1])
        orphans = jobs.release_orphans(s, node, _PROCESS_STARTED, settings.max_attempts)
    if orphans.requeued or orphans.failed:
        log.warning("jobs of an earlier %s: requeued %s, failed %s", node, orphans.requeued, orphans.failed)
        try:
            _dispatch_queued()
        except Exception:  # the broker may be down: the reaper publishes them later
            log.exception("could not enqueue the requeued jobs now; the reaper will")
    threading.Thread(target=_beat_presence, args=(name,), name="worker-presence", daemon=True).start()


def _beat_presence(name: str) -> None:
    """Keep this worker's `last_seen` current while it lives, so the fleet can tell live workers from gone ones
    (a job on a queue no live worker consumes says so, and fails after a deadline)."""
    interval = get_settings().heartbeat_interval_s
    while True:
        time.sleep(interval)
        try:
            with session_scope() as s:
                catalog.touch_worker(s, name)
        except Exception:  # the store may be briefly down; the next beat retries
            log.warning("worker presence heartbeat failed", exc_info=True)
