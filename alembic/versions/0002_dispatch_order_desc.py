"""Dispatch-order index with priority descending, as the dispatch query reads it.

A database created by the first release of 0001 has ``ix_runs_dispatch_order`` on
``(status, priority, created_at_ms)`` ascending; the planner then sorts the whole queue
for ``ORDER BY priority DESC, created_at_ms``. Rebuild it with ``priority DESC`` (on a
database whose 0001 already made it so, this rebuilds the same index).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

INDEX = "ix_runs_dispatch_order"


def upgrade() -> None:
    op.drop_index(INDEX, table_name="runs")
    op.create_index(INDEX, "runs", ["status", sa.text("priority DESC"), "created_at_ms"])


def downgrade() -> None:
    op.drop_index(INDEX, table_name="runs")
    op.create_index(INDEX, "runs", ["status", "priority", "created_at_ms"])
