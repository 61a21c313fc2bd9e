"""Service settings, read from `KERNELFLEET_*` environment variables.

The defaults are the embedded setup: SQLite store and SQLite-backed Celery broker under `data_dir`,
so one command runs everything on one machine with no servers. Production sets
`KERNELFLEET_DATABASE_URL=postgresql+psycopg://...` and `KERNELFLEET_BROKER_URL=redis://...`.
"""

from __future__ import annotations

import functools
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KERNELFLEET_", extra="ignore")

    data_dir: Path = Field(default=Path(".kernelfleet"), description="embedded store, broker and artifacts")
    database_url: str | None = None
    broker_url: str | None = None

    # Redis redelivers an unacked job only after this; the store's reaper is the backstop on any broker.
    broker_visibility_timeout_s: int = 3600
    broker_unacked_restore_interval_s: float = 10.0
    heartbeat_interval_s: float = 5.0
    # A job whose worker died waits up to stale_after_s + reap_interval_s for the reaper (it waited 60 + 15 s, 73 s
    # observed, issue 34): 6 missed heartbeats, as for workers' presence. A worker started again under its node
    # name gives back its dead process's jobs at once (service.store.jobs.release_orphans).
    stale_after_s: float = 30.0
    reap_interval_s: float = 10.0
    worker_stale_after_s: float = Field(
        default=30.0, gt=0, description="a worker whose heartbeats stopped this long ago is offline"
    )
    no_worker_deadline_s: float = Field(
        default=600.0, gt=0, description="a job queued this long on a queue no live worker consumes fails"
    )
    max_attempts: int = 3
    worker_queues: str | None = Field(default=None, description="comma-separated; default: the host's own queue")
    measure_timeout_s: int = 30
    auth_enabled: bool = Field(default=True, description="require API keys on /v1 (off only for trusted local use)")
    submit_rate_per_minute: float = Field(default=120, gt=0, description="job/workload submissions per key")
    telemetry_rate_per_minute: float = Field(default=600, gt=0, description="telemetry batches per key")
    target_rate_per_minute: float = Field(default=30, gt=0, description="target registrations per key")
    # An inference host looks up each (workload, target, shape) once (the SDK caches kernels, and dispatch tables
    # on disk, revalidated with their ETag): its start-up is a few hundred lookups, well within one minute's burst.
    lookup_rate_per_minute: float = Field(
        default=6000, gt=0, description="keys looked up per key (a batch counts each key), dispatch tables, artifacts"
    )
    auth_failures_per_minute: float = Field(
        default=30, gt=0, description="API keys that fail to authenticate per client address before 429"
    )
    max_target_details_bytes: int = Field(
        default=4096, ge=2, description="bytes of the JSON of a target's details, and of its metadata"
    )
    max_body_bytes: int = 1 << 20
    # Bounds on what a request may ask for (422 naming the field beyond them).
    max_tensor_elements: int = Field(default=1 << 31, ge=1, description="elements of any one tensor of a workload")
    max_shape_flops: float = Field(default=1e13, gt=0, description="FLOPs of a workload at one concrete shape")
    # An imported config faster than this would win every lookup: refused below the larger of the two floors.
    min_plausible_latency_s: float = Field(default=1e-8, ge=0, description="no kernel call returns faster")
    max_plausible_flops_per_s: float = Field(default=1e15, gt=0, description="no device computes faster")
    db_pool_timeout_s: float = 5.0
    publish_only_faster_than_vendor: bool = Field(
        default=True, description="publish a tuned config only if it beats the vendor as the SDK calls both"
    )
    table_regression_ratio: float = Field(
        default=1.10,
        gt=1.0,
        description="a new dispatch table slower than the one it would replace by this geomean factor, over the shapes "
        "both jobs measured, is not published",
    )
    ukernel_vendor_routes: bool = Field(
        default=True,
        description="ukernel tables route each S where the vendor is faster as the SDK calls both to the vendor "
        "(off: every S runs on uKernels, e.g. to study the tables themselves)",
    )
    # fleet-wide daily tuning (service/workers/fleet)
    fleet_daily_hour: int = Field(default=3, ge=0, le=23, description="UTC hour of the daily fleet run")
    fleet_daily_minute: int = Field(default=0, ge=0, le=59)
    fleet_window_days: int = Field(default=7, ge=1, le=90, description="telemetry days the daily run ranks on")
    fleet_silent_after_days: int = Field(
        default=2, ge=1, le=90, description="a task without telemetry for this many days is silent: named, not tuned"
    )
    fleet_daily_trials: int = Field(default=512, ge=0, description="trials per hardware class per day")
    fleet_unit_trials: int = Field(default=32, ge=1, description="trials per scheduler unit")
    fleet_daily_worker_s: float = Field(
        default=3600, ge=0, description="worker seconds per hardware class per day the daily run may plan (with "
        "fleet_daily_trials, whichever gives fewer units), at the seconds a unit took in earlier fleet jobs",
    )  # fmt: skip
    fleet_prior_unit_s: float = Field(
        default=60, gt=0, description="worker seconds a unit is assumed to take before a fleet job has run"
    )
    fleet_max_tasks: int = Field(default=20, ge=1, description="tasks considered per day, best first")
    fleet_prior_speedup: float = Field(default=1.5, ge=1.0, description="assumed speedup before any is measured")
    fleet_remeasure_sample: int = Field(default=2, ge=0, description="published configs re-timed per day")
    fleet_run_stale_s: float = Field(default=3600, gt=0, description="a daily run 'running' longer is taken over")
    fleet_regression_ratio: float = Field(default=1.25, gt=1.0, description="re-timed / stored above this: flagged")
    fleet_rollback_margin: float = Field(
        default=0.03, ge=0.0, le=1.0,
        description="a table slower than its hosts' baseline or the table it replaced by more than this share, "
        "beyond the 95 % interval of the A/B telemetry, is rolled back",
    )  # fmt: skip
    signing_key: str | None = Field(
        default=None, description="base64 Ed25519 seed that signs artifacts; default: $DATA_DIR/signing.key"
    )

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'kernelfleet.db').resolve()}"

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or f"sqla+sqlite:///{(self.data_dir / 'broker.db').resolve()}"

    def ensure_dirs(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)


@functools.cache
def get_settings() -> Settings:
    settings = Settings()
    settings.ensure_dirs()
    return settings
