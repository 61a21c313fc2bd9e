"""Shared fixtures: real PostgreSQL, Redis, SQLite, and service processes (API, Celery workers, beat).

The environment is pinned here, before any `service` import, so settings, engines and the Celery app
all see the test configuration.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))
_DATA = Path(tempfile.mkdtemp(prefix="kf-test-"))
os.environ["KERNELFLEET_DATA_DIR"] = str(_DATA)
for _var in ("KERNELFLEET_DATABASE_URL", "KERNELFLEET_BROKER_URL", "KERNELFLEET_WORKER_QUEUES"):
    os.environ.pop(_var, None)


@pytest.fixture(autouse=True)
def _sdk_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh SDK cache per test: each test's service has its own signing key, and the SDK pins the first
    key it sees per URL (ports get reused)."""
    monkeypatch.setenv("KERNELFLEET_CACHE_DIR", str(tmp_path_factory.mktemp("sdk-cache")))


PG_ADMIN_URL = os.environ.get("KERNELFLEET_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("KERNELFLEET_TEST_REDIS", "redis://127.0.0.1:6379")


def _pg_database() -> Iterator[str]:
    from sqlalchemy import create_engine, text

    name = f"kf_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        from service.store.db import get_engine

        get_engine.cache_clear()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for one test."""
    from service.store.db import migrate

    for url in _pg_database():
        migrate(url)
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    from service.store.db import migrate

    url = f"sqlite:///{tmp_path / 'store.db'}"
    migrate(url)
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest) -> str:
    """Each store test runs on both backends."""
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    url: str = request.getfixturevalue(name)
    return url


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A Redis database index of its own, flushed before and after."""
    import redis

    # KERNELFLEET_TEST_REDIS_DB pins the index so concurrent test runs on one machine never share one.
    # Under pytest-xdist (`make test` runs some directories two at a time) each worker has an index of its own.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    default = 9 + (int(worker[2:]) % 6 if worker.startswith("gw") else os.getpid() % 6)
    db = int(os.environ.get("KERNELFLEET_TEST_REDIS_DB", default))
    url = f"{REDIS_URL}/{db}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


@pytest.fixture
def use_store(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Point this process's settings, engines and sessions at `store_url`."""
    yield from _use_store(store_url, monkeypatch)


def _use_store(url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from service.settings import get_settings
    from service.store import db

    monkeypatch.setenv("KERNELFLEET_DATABASE_URL", url)
    get_settings.cache_clear()
    db.get_engine.cache_clear()
    db._session_factory.cache_clear()
    db._read_engine.cache_clear()
    yield url
    db.get_engine(url).dispose()
    db._read_engine(url).dispose()
    monkeypatch.delenv("KERNELFLEET_DATABASE_URL")
    get_settings.cache_clear()
    db.get_engine.cache_clear()
    db._session_factory.cache_clear()
    db._read_engine.cache_clear()


_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave without the interpreter's teardown once pytest has reported. With torch's and TVM's OpenMP
    runtimes and thread pools in one process, the full run died of SIGBUS after printing its summary
    (2026-11-26), turning its exit status into a crash; the status pytest computed is what counts."""
    if _EXIT_STATUS and not os.environ.get("KERNELFLEET_TEST_NORMAL_EXIT"):
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])
