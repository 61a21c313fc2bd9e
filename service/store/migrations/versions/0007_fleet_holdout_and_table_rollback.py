"""fleet holdout (A/B telemetry), dispatch table rollback, job CPU seconds

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27 20:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import service.store.tables

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fleet_holdout",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("workload_hash", sa.String(length=64), nullable=False),
        sa.Column("target_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("table_job_id", sa.String(length=64), nullable=False),
        sa.Column("shape_key", sa.String(length=200), nullable=False),
        sa.Column("served_calls", sa.BigInteger(), nullable=False),
        sa.Column("served_s", sa.Float(), nullable=False),
        sa.Column("served_s2", sa.Float(), nullable=False),
        sa.Column("baseline_calls", sa.BigInteger(), nullable=False),
        sa.Column("baseline_s", sa.Float(), nullable=False),
        sa.Column("baseline_s2", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("day", "workload_hash", "target_fingerprint", "table_job_id", "shape_key"),
    )
    with op.batch_alter_table("dispatch_tables") as batch:
        batch.add_column(sa.Column("retired_at", service.store.tables.UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("retired_reason", sa.String(length=500), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("cpu_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("cpu_seconds")
    with op.batch_alter_table("dispatch_tables") as batch:
        batch.drop_column("retired_reason")
        batch.drop_column("retired_at")
    op.drop_table("fleet_holdout")
