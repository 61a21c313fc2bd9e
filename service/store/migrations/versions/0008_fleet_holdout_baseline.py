"""fleet holdout keyed by the baseline the hosts held calls out for

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27 23:20:00

The A/B sums of hosts that run different baselines (numpy, PyTorch) at one shape must not be added together,
and the daily run reads which library a layer's hosts run from them. Rows from before carry baseline "" (not
recorded). The table is rebuilt under a new name and renamed, so the primary key can change on SQLite and
PostgreSQL alike.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import SchemaItem

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

SUMS = ("served_calls", "served_s", "served_s2", "baseline_calls", "baseline_s", "baseline_s2")
KEYS = ("day", "workload_hash", "target_fingerprint", "table_job_id", "shape_key")


def _create(name: str, keyed_by_baseline: bool) -> None:
    keys: list[SchemaItem] = [
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("workload_hash", sa.String(length=64), nullable=False),
        sa.Column("target_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("table_job_id", sa.String(length=64), nullable=False),
        sa.Column("shape_key", sa.String(length=200), nullable=False),
    ]
    if keyed_by_baseline:
        keys.append(sa.Column("baseline", sa.String(length=64), nullable=False))
    sums: list[SchemaItem] = [
        sa.Column(s, sa.BigInteger() if s.endswith("calls") else sa.Float(), nullable=False) for s in SUMS
    ]
    primary = [*KEYS, "baseline"] if keyed_by_baseline else list(KEYS)
    op.create_table(name, *keys, *sums, sa.PrimaryKeyConstraint(*primary, name=f"{name}_pkey"))


def _move(source: str, target: str, baseline: str | None) -> None:
    """Copy `source` into `target`: with `baseline` the value every row gets, else summed over baselines."""
    columns = ", ".join((*KEYS, *SUMS))
    if baseline is not None:
        op.execute(f"INSERT INTO {target} ({columns}, baseline) SELECT {columns}, '{baseline}' FROM {source}")
    else:
        sums = ", ".join(f"SUM({s})" for s in SUMS)
        keys = ", ".join(KEYS)
        op.execute(f"INSERT INTO {target} ({columns}) SELECT {keys}, {sums} FROM {source} GROUP BY {keys}")
    op.drop_table(source)
    op.rename_table(target, "fleet_holdout")


def upgrade() -> None:
    _create("fleet_holdout_by_baseline", keyed_by_baseline=True)
    _move("fleet_holdout", "fleet_holdout_by_baseline", baseline="")


def downgrade() -> None:
    _create("fleet_holdout_summed", keyed_by_baseline=False)
    _move("fleet_holdout", "fleet_holdout_summed", baseline=None)
