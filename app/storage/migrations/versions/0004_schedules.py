"""Schedules, their decisions, and what triggered a run (docs/schedules.md).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

ID = sa.String(36)
MS = sa.BigInteger()


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", ID, nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("cursor_ms", MS, nullable=False),
        sa.Column("next_due_ms", MS, nullable=True),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("created_at_ms", MS, nullable=False),
        sa.Column("updated_at_ms", MS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_schedules"),
        sa.UniqueConstraint("name", name="uq_schedules_name"),
    )
    op.create_index("ix_schedules_next_due_ms", "schedules", ["next_due_ms"])
    op.create_table(
        "schedule_decisions",
        sa.Column("id", ID, nullable=False),
        sa.Column("schedule_id", ID, nullable=False),
        sa.Column("slot_ms", MS, nullable=False),
        sa.Column("decision", sa.String(24), nullable=False),
        sa.Column("run_id", ID, nullable=True),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("until_slot_ms", MS, nullable=True),
        sa.Column("at_ms", MS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_schedule_decisions"),
    )
    op.create_index(
        "ix_schedule_decisions_schedule_id_id",
        "schedule_decisions",
        ["schedule_id", sa.text("id DESC")],
    )
    # Existing runs were all started by hand: the server default gives them 'manual'.
    op.add_column(
        "runs",
        sa.Column("trigger_kind", sa.String(16), nullable=False, server_default="manual"),
    )
    op.add_column("runs", sa.Column("schedule_id", ID, nullable=True))
    op.add_column("runs", sa.Column("schedule_name", sa.String(128), nullable=True))
    op.add_column("runs", sa.Column("slot_ms", MS, nullable=True))
    op.create_index(
        "ix_runs_schedule_id_slot_ms", "runs", ["schedule_id", "slot_ms"], unique=True
    )


def downgrade() -> None:
    op.drop_index("ix_runs_schedule_id_slot_ms", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("slot_ms")
        batch.drop_column("schedule_name")
        batch.drop_column("schedule_id")
        batch.drop_column("trigger_kind")
    op.drop_index("ix_schedule_decisions_schedule_id_id", table_name="schedule_decisions")
    op.drop_table("schedule_decisions")
    op.drop_index("ix_schedules_next_due_ms", table_name="schedules")
    op.drop_table("schedules")
