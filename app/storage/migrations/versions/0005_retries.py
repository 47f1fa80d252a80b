"""Retries as new attempts, and reruns (docs/retries.md).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Additive only: existing attempts start at once (NULL), existing runs repeat none.
    op.add_column("attempts", sa.Column("not_before_ms", sa.BigInteger(), nullable=True))
    op.add_column("runs", sa.Column("rerun_of", sa.String(36), nullable=True))
    op.add_column("runs", sa.Column("not_before_ms", sa.BigInteger(), nullable=True))
    op.create_index(
        "ix_runs_ready_order",
        "runs",
        ["status", "not_before_ms", sa.text("priority DESC"), "created_at_ms"],
    )


def downgrade() -> None:
    op.drop_index("ix_runs_ready_order", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("not_before_ms")
        batch.drop_column("rerun_of")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("not_before_ms")
