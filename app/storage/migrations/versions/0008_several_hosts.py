"""Several execution hosts on one PostgreSQL database (docs/several-hosts.md).

The lease row carries its host's advertised api base URL (log reads of another host's
attempts are proxied there); every attempt records the worker instance and lease epoch that
launched it, and every journal entry the instance that wrote it, so a worker reconciles,
times out, cancels and sweeps only what its own host ran. All columns are nullable: rows
written before this revision belong to the single worker of that time.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("worker_leases", sa.Column("base_url", sa.String(255), nullable=True))
    op.add_column("attempts", sa.Column("worker_instance_id", sa.String(36), nullable=True))
    op.add_column("attempts", sa.Column("lease_epoch", sa.BigInteger(), nullable=True))
    op.create_index(
        "ix_attempts_worker_instance_id_status", "attempts", ["worker_instance_id", "status"]
    )
    op.add_column(
        "receipt_journal", sa.Column("worker_instance_id", sa.String(36), nullable=True)
    )


def downgrade() -> None:
    with op.batch_alter_table("receipt_journal") as batch:
        batch.drop_column("worker_instance_id")
    op.drop_index("ix_attempts_worker_instance_id_status", table_name="attempts")
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("lease_epoch")
        batch.drop_column("worker_instance_id")
    with op.batch_alter_table("worker_leases") as batch:
        batch.drop_column("base_url")
