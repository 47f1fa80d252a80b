"""Retention: pinned runs, expired logs, task policies, the last sweep (docs/retention.md).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

MS = sa.BigInteger()


def upgrade() -> None:
    # Additive only: existing runs are unpinned, existing logs are there (log_state NULL).
    op.add_column(
        "runs", sa.Column("pinned", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.add_column("attempts", sa.Column("log_state", sa.String(16), nullable=True))
    op.add_column("attempts", sa.Column("log_expired_at_ms", MS, nullable=True))
    op.create_index(
        "ix_attempts_log_state",
        "attempts",
        ["log_state"],
        postgresql_where=sa.text("log_state IS NOT NULL"),
        sqlite_where=sa.text("log_state IS NOT NULL"),
    )
    op.create_table(
        "task_retention",
        sa.Column("task", sa.String(128), nullable=False),
        sa.Column("keep_runs", sa.Integer(), nullable=True),
        sa.Column("keep_days", sa.Integer(), nullable=True),
        sa.Column("keep_rows", sa.Integer(), nullable=True),
        sa.Column("task_log_bytes", sa.BigInteger(), nullable=True),
        sa.Column("updated_at_ms", MS, nullable=False),
        sa.PrimaryKeyConstraint("task", name="pk_task_retention"),
    )
    op.create_table(
        "retention_sweeps",
        sa.Column("sweeper", sa.String(16), nullable=False),
        sa.Column("at_ms", MS, nullable=False),
        sa.Column("duration_ms", MS, nullable=False),
        sa.Column("expired_logs", sa.Integer(), nullable=False),
        sa.Column("finished_expiring", sa.Integer(), nullable=False),
        sa.Column("deleted_runs", sa.Integer(), nullable=False),
        sa.Column("freed_bytes", sa.BigInteger(), nullable=False),
        sa.Column("log_bytes", sa.BigInteger(), nullable=False),
        sa.Column("free_bytes", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("sweeper", name="pk_retention_sweeps"),
    )


def downgrade() -> None:
    op.drop_table("retention_sweeps")
    op.drop_table("task_retention")
    op.drop_index("ix_attempts_log_state", table_name="attempts")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("log_expired_at_ms")
        batch.drop_column("log_state")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("pinned")
