"""A token may expire: ``qinglong token create --expires-in 30d`` (docs/api.md §1).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("expires_at_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    # A build without expiry would take an expiring token as valid for good: it is marked
    # revoked instead (at its expiry instant), so the older build refuses it at once.
    op.execute(
        "UPDATE api_tokens SET revoked_at_ms = expires_at_ms"
        " WHERE revoked_at_ms IS NULL AND expires_at_ms IS NOT NULL"
    )
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("expires_at_ms")
