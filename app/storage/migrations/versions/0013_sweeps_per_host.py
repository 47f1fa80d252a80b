"""Each host's own last retention sweep (docs/retention.md §5, docs/several-hosts.md).

``retention_sweeps`` held one row, ``logs``, that every host's sweep overwrote: a host whose
sweeps stopped was hidden behind the others. With several hosts (PostgreSQL) each worker
now writes the row keyed by its instance id (36 characters), so the key widens; SQLite's
one host keeps ``logs``.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("retention_sweeps") as batch:
        batch.alter_column(
            "sweeper", type_=sa.String(40), existing_type=sa.String(16), existing_nullable=False
        )


def downgrade() -> None:
    # The older build reads the one row ``logs``: the newest pass of any host becomes it.
    op.execute(
        "DELETE FROM retention_sweeps WHERE sweeper NOT IN"
        " (SELECT sweeper FROM retention_sweeps ORDER BY at_ms DESC, sweeper LIMIT 1)"
    )
    op.execute("UPDATE retention_sweeps SET sweeper = 'logs'")
    with op.batch_alter_table("retention_sweeps") as batch:
        batch.alter_column(
            "sweeper", type_=sa.String(16), existing_type=sa.String(40), existing_nullable=False
        )
