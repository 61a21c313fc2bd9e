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
    stale_after_s: float = 60.0
    reap_interval_s: float = 15.0
    max_attempts: int = 3
    worker_queues: str | None = Field(default=None, description="comma-separated; default: the host's own queue")
    measure_timeout_s: int = 30
    auth_enabled: bool = Field(default=True, description="require API keys on /v1 (off only for trusted local use)")
    submit_rate_per_minute: float = Field(default=120, gt=0, description="job/workload submissions per key")
    max_body_bytes: int = 1 << 20
    db_pool_timeout_s: float = 5.0
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
