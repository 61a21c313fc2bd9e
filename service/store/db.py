"""Engines and sessions for the store (SQLite embedded, PostgreSQL in production)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from service.settings import get_settings

_MIGRATIONS = Path(__file__).parent / "migrations"


def dialect_insert(session: Session) -> Any:
    """The INSERT construct of the session's database, for ON CONFLICT clauses (PostgreSQL's or SQLite's)."""
    return postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert


def make_engine(url: str, *, autocommit_reads: bool = False) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            # WAL lets the API read while a worker writes; the API, workers and beat share one file.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    timeout = get_settings().db_pool_timeout_s
    connect_args = {"connect_timeout": max(1, int(timeout))} if url.startswith("postgresql") else {}
    if autocommit_reads:
        # One round trip per lookup: no BEGIN/COMMIT and no pre-ping. A connection that died with the
        # server fails its first statement instead; `read_connection` callers retry that once.
        return create_engine(
            url, isolation_level="AUTOCOMMIT", pool_timeout=timeout, pool_size=10, connect_args=connect_args
        )
    return create_engine(url, pool_pre_ping=True, pool_timeout=timeout, connect_args=connect_args)


@functools.cache
def get_engine(url: str | None = None) -> Engine:
    return make_engine(url or get_settings().resolved_database_url)


@functools.cache
def _read_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        return get_engine(url)  # SQLite has no round trips to save
    return make_engine(url, autocommit_reads=True)


@contextmanager
def read_connection(url: str | None = None) -> Iterator[Connection]:
    """A connection for single-statement reads on hot paths (lookups): autocommit, nothing to commit, and no ORM
    session (a lookup through `Session.get` cost 410 µs against 230 µs through a Core select on PostgreSQL)."""
    with _read_engine(url or get_settings().resolved_database_url).connect() as conn:
        yield conn


@functools.cache
def _session_factory(url: str | None = None) -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(url), expire_on_commit=False)


@contextmanager
def session_scope(url: str | None = None) -> Iterator[Session]:
    """One transaction: committed on success, rolled back on error."""
    session = _session_factory(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def migrate(url: str | None = None) -> None:
    """Bring the schema to the newest revision; safe to run from several processes at start-up."""
    command.upgrade(alembic_config(url or get_settings().resolved_database_url), "head")
