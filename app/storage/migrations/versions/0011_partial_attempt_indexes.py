"""The status indexes of ``attempts`` hold the attempts starting or running only.

An attempt is written four times (its insert as ``claimed`` with its run, T1's
``starting``, T2's ``running``, its ending), and each of these writes changes its status,
so on PostgreSQL none is a heap-only update: each wrote a new entry into all three status
indexes, twelve a run. Every read of them asks for the attempts starting or running (the
reconciler's page, the deadline sweep, a host's share, a lease expiry's page, the metrics),
so they hold only those now: six entries a run, none at the insert or the ending
(docs/design.md §5.2).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# As app/storage/tables.py's ACTIVE_ATTEMPT_WHERE at this revision (a migration keeps its own).
_ACTIVE = "status IN ('starting', 'running')"
_INDEXES = {
    "ix_attempts_status_id": ["status", "id"],
    "ix_attempts_status_deadline_at_ms": ["status", "deadline_at_ms"],
    "ix_attempts_worker_instance_id_status": ["worker_instance_id", "status"],
}


def upgrade() -> None:
    where = {"postgresql_where": sa.text(_ACTIVE), "sqlite_where": sa.text(_ACTIVE)}
    for name, columns in _INDEXES.items():
        op.drop_index(name, table_name="attempts")
        op.create_index(name, "attempts", columns, **where)


def downgrade() -> None:
    for name, columns in _INDEXES.items():
        op.drop_index(name, table_name="attempts")
        op.create_index(name, "attempts", columns)
