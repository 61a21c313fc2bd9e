"""The Celery application: broker, queues, reliability settings and the beat schedule.

Importing this module loads no TVM, so the API can enqueue jobs with it. Queues are per hardware
class (`cpu.<mcpu>`, `gpu.<arch>`, `firesim`) plus `control` for housekeeping every worker serves.
"""

from __future__ import annotations

from celery import Celery
from celery.schedules import crontab

from service.settings import Settings, get_settings

CONTROL_QUEUE = "control"
RUN_JOB = "kernelfleet.run_job"
REAP = "kernelfleet.reap"
FLEET_DAILY = "kernelfleet.fleet_daily"


def _transport_options(settings: Settings) -> dict[str, float]:
    if not settings.resolved_broker_url.startswith(("redis://", "rediss://")):
        return {}  # the SQLAlchemy transport passes its options to create_engine; it has no redelivery to tune
    return {
        "visibility_timeout": settings.broker_visibility_timeout_s,
        "unacked_restore_interval": settings.broker_unacked_restore_interval_s,
        "unacked_restore_throttle": 1,
    }


def make_celery(settings: Settings) -> Celery:
    app = Celery("kernelfleet", broker=settings.resolved_broker_url, include=["service.workers.tasks"])
    app.conf.update(
        task_acks_late=True,  # a job's message is acked only after the job ran...
        task_reject_on_worker_lost=True,  # ...and goes back to the queue if its worker dies
        worker_prefetch_multiplier=1,
        task_ignore_result=True,  # job state lives in the store, not in a result backend
        task_default_queue=CONTROL_QUEUE,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        broker_transport_options=_transport_options(settings),
        worker_hijack_root_logger=False,
        beat_schedule={
            "reap-stale-jobs": {
                "task": REAP,
                "schedule": settings.reap_interval_s,
                "options": {"queue": CONTROL_QUEUE},
            },
            # several beats or a restart may fire it more than once: the store runs a day at most once
            "fleet-daily": {
                "task": FLEET_DAILY,
                "schedule": crontab(hour=settings.fleet_daily_hour, minute=settings.fleet_daily_minute),
                "options": {"queue": CONTROL_QUEUE},
            },
        },
        timezone="UTC",
    )
    return app


app = make_celery(get_settings())


def enqueue(job_id: str, queue: str) -> None:
    """Send a job's Celery message to the queue of the hardware it targets."""
    app.send_task(RUN_JOB, args=[job_id], queue=queue)
