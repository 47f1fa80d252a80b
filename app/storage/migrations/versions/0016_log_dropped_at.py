"""Where an attempt's log lost its dropped bytes: the log keeps the output's head and tail.

The shim's truncation fact now names the log's offset of the gap (``gapAt``); the completion
copies it here. NULL for attempts recorded before, whose dropped bytes were the output's end.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("attempts", sa.Column("log_dropped_at", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("log_dropped_at")
