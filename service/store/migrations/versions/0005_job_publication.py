"""job publication: whether a succeeded job published anything, and why not

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 20:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("published", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("publish_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("publish_reason")
        batch.drop_column("published")
