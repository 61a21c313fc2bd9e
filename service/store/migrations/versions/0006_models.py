"""models: a model onboarded in one request, and its ops linking it to workloads and jobs

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import service.store.tables

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("target", sa.JSON(), nullable=False),
        sa.Column("budget", sa.JSON(), nullable=False),
        sa.Column("split", sa.JSON(), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("owner_key_id", sa.String(length=36), nullable=True),
        sa.Column("created_at", service.store.tables.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_models_name", "models", ["name"])
    op.create_index("ix_models_owner_key_id", "models", ["owner_key_id"])
    op.create_index("ix_models_created_at", "models", ["created_at"])
    op.create_table(
        "model_ops",
        sa.Column("model_id", sa.String(length=36), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("workload_hash", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=True),
        sa.Column("occurrences", sa.Integer(), nullable=False),
        sa.Column("distribution", sa.JSON(), nullable=False),
        sa.Column("dims", sa.JSON(), nullable=False),
        sa.Column("sources", sa.JSON(), nullable=False),
        sa.Column("priority", sa.Float(), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("skipped", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"]),
        sa.ForeignKeyConstraint(["workload_hash"], ["workloads.workload_hash"]),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.PrimaryKeyConstraint("model_id", "idx"),
    )
    op.create_index("ix_model_ops_job_id", "model_ops", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_model_ops_job_id", table_name="model_ops")
    op.drop_table("model_ops")
    op.drop_index("ix_models_created_at", table_name="models")
    op.drop_index("ix_models_owner_key_id", table_name="models")
    op.drop_index("ix_models_name", table_name="models")
    op.drop_table("models")
