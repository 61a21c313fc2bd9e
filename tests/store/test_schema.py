"""The migrations build exactly the tables the code declares (service.store.tables), on SQLite and PostgreSQL: a
column added to a table without a migration, or a migration that drifts from the table, fails here."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from service.store import db
from service.store.tables import Base


def test_the_migrated_schema_is_the_declared_one(use_store: str) -> None:
    db.migrate(use_store)
    with db.get_engine(use_store).connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []
