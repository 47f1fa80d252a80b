"""The dispatch page's own index (docs/design.md §3.3).

``ix_runs_dispatch_order`` (status, priority DESC, created) lacked the run id, the page's
last sort key, and kept waiting retries: PostgreSQL's generic plan of the hot prepared page
statement read every queued run and sorted them to keep the first seventeen (341 rows for a
17-row page in a 600-run burst), or walked it behind every waiting retry. The partial index
holds only the queued runs that wait for no retry, in exactly the page's order, so the walk
stops after ``limit + 1`` rows; a run leaves it at T1, and no later transition writes to it
(the old index changed at every status change of every run). It replaces the old index,
which nothing else reads (``ix_runs_status_id`` serves the counts by status).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# As app/storage/tables.py's READY_PAGE_WHERE at this revision (a migration keeps its own).
_WHERE = "status = 'queued' AND not_before_ms IS NULL"


def upgrade() -> None:
    op.create_index(
        "ix_runs_ready_page",
        "runs",
        [sa.text("priority DESC"), "created_at_ms", "id"],
        postgresql_where=sa.text(_WHERE),
        sqlite_where=sa.text(_WHERE),
    )
    op.drop_index("ix_runs_dispatch_order", table_name="runs")


def downgrade() -> None:
    op.create_index(
        "ix_runs_dispatch_order", "runs", ["status", sa.text("priority DESC"), "created_at_ms"]
    )
    op.drop_index("ix_runs_ready_page", table_name="runs")
