"""Indexes of ``runs`` that hold only the rows their reads ask for (docs/design.md §3.3).

Every UPDATE of a run that changes its status writes a new entry into every index of
``runs`` whose predicate the new row meets (the status is indexed, so no such UPDATE is a
heap-only one), and an ordinary run is written four times (enqueue, T1, T2, its ending).
Three indexes held every run and served only a few:

- ``ix_runs_ready_order`` (status, not_before_ms, priority DESC, created): only the reads
  of runs waiting for a retry's instant walk it (the next instant, the due ones), and since
  migration 0009 nothing else. ``ix_runs_retry_wait`` holds exactly those runs, by instant.
- ``ix_runs_schedule_id_slot_ms`` (unique) and ``ix_runs_schedule_id_status``: every read
  of them asks for one schedule's runs; a run no schedule made (NULL ``schedule_id``) is
  now in neither. A unique index never compared NULLs, so the slot rule is unchanged.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# As app/storage/tables.py's predicates at this revision (a migration keeps its own).
_RETRY_WAIT = "status = 'queued' AND not_before_ms IS NOT NULL"
_SCHEDULED = "schedule_id IS NOT NULL"


def _partial(where: str) -> dict[str, sa.TextClause]:
    return {"postgresql_where": sa.text(where), "sqlite_where": sa.text(where)}


def upgrade() -> None:
    op.create_index("ix_runs_retry_wait", "runs", ["not_before_ms"], **_partial(_RETRY_WAIT))
    op.drop_index("ix_runs_ready_order", table_name="runs")
    # Dropped and made again in the migration's one transaction (on both engines), so no
    # other transaction sees a moment without the slot rule.
    op.drop_index("ix_runs_schedule_id_slot_ms", table_name="runs")
    op.create_index(
        "ix_runs_schedule_id_slot_ms", "runs", ["schedule_id", "slot_ms"], unique=True,
        **_partial(_SCHEDULED),
    )  # fmt: skip
    op.drop_index("ix_runs_schedule_id_status", table_name="runs")
    op.create_index(
        "ix_runs_schedule_id_status", "runs", ["schedule_id", "status"], **_partial(_SCHEDULED)
    )


def downgrade() -> None:
    op.create_index(
        "ix_runs_ready_order",
        "runs",
        ["status", "not_before_ms", sa.text("priority DESC"), "created_at_ms"],
    )
    op.drop_index("ix_runs_retry_wait", table_name="runs")
    op.drop_index("ix_runs_schedule_id_status", table_name="runs")
    op.create_index("ix_runs_schedule_id_status", "runs", ["schedule_id", "status"])
    op.drop_index("ix_runs_schedule_id_slot_ms", table_name="runs")
    op.create_index("ix_runs_schedule_id_slot_ms", "runs", ["schedule_id", "slot_ms"], unique=True)
