"""Worker lease and service events (docs/worker-lease.md).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

ID = sa.String(36)
MS = sa.BigInteger()


def upgrade() -> None:
    op.create_table(
        "worker_leases",
        sa.Column("slot", sa.String(32), nullable=False),
        sa.Column("instance_id", ID, nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("boot_id", sa.String(64), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("start_ticks", sa.BigInteger(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("acquired_at_ms", MS, nullable=False),
        sa.Column("renewed_at_ms", MS, nullable=False),
        sa.Column("expires_at_ms", MS, nullable=False),
        sa.Column("released_at_ms", MS, nullable=True),
        sa.PrimaryKeyConstraint("slot", name="pk_worker_leases"),
    )
    op.create_table(
        "service_events",
        sa.Column("id", ID, nullable=False),
        sa.Column("type", sa.String(48), nullable=False),
        sa.Column("at_ms", MS, nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_service_events"),
    )


def downgrade() -> None:
    op.drop_table("service_events")
    op.drop_table("worker_leases")
