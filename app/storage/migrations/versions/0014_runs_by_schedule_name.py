"""Runs by the name of the schedule that started them, newest first (docs/api.md §6).

``GET /api/v1/runs?schedule=NAME`` lists a schedule's runs by id, the list's one order.
The indexes on ``schedule_id`` order a schedule's runs by slot, so without this one a page
read every run the schedule ever had (86,400 a day for an every-second one) to sort them.
The name, not the id: a run keeps its schedule's name after the schedule is deleted, and
the list shows that name. Partial: a run no schedule made is not in it, so an ordinary
run's insert writes nothing here (no later transition changes the columns).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# As app/storage/tables.py's predicate at this revision (a migration keeps its own).
_NAMED = "schedule_name IS NOT NULL"


def upgrade() -> None:
    op.create_index(
        "ix_runs_schedule_name_id", "runs", ["schedule_name", "id"],
        postgresql_where=sa.text(_NAMED), sqlite_where=sa.text(_NAMED),
    )  # fmt: skip


def downgrade() -> None:
    op.drop_index("ix_runs_schedule_name_id", table_name="runs")
