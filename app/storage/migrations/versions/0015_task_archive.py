"""Archived tasks (docs/api.md §4): a task is hidden from lists and refuses new runs.

Revisions stay immutable and runs keep their history, so a task is never deleted; a row of
``task_archive`` says it is retired. A task with no row is not archived, so the upgrade
writes nothing but the table.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "task_archive",
        sa.Column("task", sa.String(128), nullable=False),
        sa.Column("archived_at_ms", sa.BigInteger(), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("task", name="pk_task_archive"),
    )


def downgrade() -> None:
    # An older build knows no archive: every archived task is listed and runs again.
    op.drop_table("task_archive")
