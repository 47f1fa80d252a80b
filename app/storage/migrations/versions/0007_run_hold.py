"""A run held behind the older runs of its schedule (overlap queue_one and replace).

``runs.hold_from_slot_ms``: when set, the run is not dispatched while a run of its schedule
with a slot in [hold_from_slot_ms, its own slot) has not ended (docs/schedules.md §5). The
range is read on the existing unique index ``ix_runs_schedule_id_slot_ms``. Also
``ix_runs_schedule_id_status``: a fire reads its schedule's runs not ended, which without it
walked every run the schedule ever had.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("hold_from_slot_ms", sa.BigInteger(), nullable=True))
    op.create_index("ix_runs_schedule_id_status", "runs", ["schedule_id", "status"])


def downgrade() -> None:
    op.drop_index("ix_runs_schedule_id_status", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("hold_from_slot_ms")
