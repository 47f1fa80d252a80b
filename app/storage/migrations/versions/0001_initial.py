"""Initial schema: definitions, secrets, runs, attempts, events, receipt journal, tokens.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ID = sa.String(36)
MS = sa.BigInteger()


def upgrade() -> None:
    op.create_table(
        "context_recipes",
        sa.Column("id", sa.String(82), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at_ms", MS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_context_recipes"),
    )
    op.create_table(
        "task_revisions",
        sa.Column("task", sa.String(128), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(71), nullable=False),
        sa.Column("executor", sa.String(32), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("recipe_id", sa.String(82), nullable=True),
        sa.Column("timeout_seconds", sa.Integer(), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("created_at_ms", MS, nullable=False),
        sa.ForeignKeyConstraint(
            ["recipe_id"],
            ["context_recipes.id"],
            name="fk_task_revisions_recipe_id_context_recipes",
        ),
        sa.PrimaryKeyConstraint("task", "revision", name="pk_task_revisions"),
    )
    op.create_table(
        "secrets",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("nonce", sa.LargeBinary(), nullable=False),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        sa.Column("created_at_ms", MS, nullable=False),
        sa.Column("updated_at_ms", MS, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_secrets"),
    )
    op.create_table(
        "runs",
        sa.Column("id", ID, nullable=False),
        sa.Column("task", sa.String(128), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("latest_attempt", sa.Integer(), nullable=False),
        sa.Column("created_at_ms", MS, nullable=False),
        sa.Column("started_at_ms", MS, nullable=True),
        sa.Column("finished_at_ms", MS, nullable=True),
        sa.Column("cancel_reason", sa.String(16), nullable=True),
        sa.Column("cancel_requested_at_ms", MS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
    )
    op.create_index(
        "ix_runs_dispatch_order", "runs", ["status", sa.text("priority DESC"), "created_at_ms"]
    )
    op.create_index("ix_runs_task_id", "runs", ["task", "id"])
    op.create_index("ix_runs_status_id", "runs", ["status", "id"])
    op.create_index("ix_runs_task_status_id", "runs", ["task", "status", "id"])
    op.create_table(
        "attempts",
        sa.Column("id", ID, nullable=False),
        sa.Column("run_id", ID, nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("executor", sa.String(32), nullable=False),
        sa.Column("created_at_ms", MS, nullable=False),
        sa.Column("started_at_ms", MS, nullable=True),
        sa.Column("finished_at_ms", MS, nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("signal", sa.Integer(), nullable=True),
        sa.Column("error_code", sa.String(64), nullable=True),
        sa.Column("callback_token_digest", sa.String(71), nullable=True),
        sa.Column("callback_sequence", sa.Integer(), nullable=False),
        sa.Column("deadline_at_ms", MS, nullable=True),
        sa.Column("log_artifact_id", sa.String(64), nullable=True),
        sa.Column("log_bytes", sa.BigInteger(), nullable=True),
        sa.Column("log_truncated", sa.Boolean(), nullable=True),
        sa.Column("log_dropped_bytes", sa.BigInteger(), nullable=True),
        sa.Column("handle", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_attempts_run_id_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_attempts"),
        sa.UniqueConstraint("run_id", "number", name="uq_attempts_run_id_number"),
    )
    op.create_index("ix_attempts_status_id", "attempts", ["status", "id"])
    op.create_index(
        "ix_attempts_status_deadline_at_ms", "attempts", ["status", "deadline_at_ms"]
    )
    op.create_table(
        "run_events",
        sa.Column("run_id", ID, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(48), nullable=False),
        sa.Column("at_ms", MS, nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_run_events_run_id_runs"),
        sa.PrimaryKeyConstraint("run_id", "seq", name="pk_run_events"),
    )
    op.create_table(
        "receipt_journal",
        sa.Column("attempt_id", ID, nullable=False),
        sa.Column("run_id", ID, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("receipt_ref", sa.String(128), nullable=False),
        sa.Column("handle", sa.Text(), nullable=True),
        sa.Column("quarantine_reason", sa.String(32), nullable=True),
        sa.Column("created_at_ms", MS, nullable=False),
        sa.Column("updated_at_ms", MS, nullable=False),
        sa.PrimaryKeyConstraint("attempt_id", name="pk_receipt_journal"),
    )
    op.create_index(
        "ix_receipt_journal_state_updated_at_ms", "receipt_journal", ["state", "updated_at_ms"]
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", ID, nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("digest", sa.String(71), nullable=False),
        sa.Column("scopes", sa.Text(), nullable=False),
        sa.Column("created_at_ms", MS, nullable=False),
        sa.Column("revoked_at_ms", MS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
        sa.UniqueConstraint("name", name="uq_api_tokens_name"),
        sa.UniqueConstraint("digest", name="uq_api_tokens_digest"),
    )
    op.create_table(
        "idempotency_keys",
        sa.Column("token_id", ID, nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("request_digest", sa.String(71), nullable=False),
        sa.Column("run_id", ID, nullable=False),
        sa.Column("created_at_ms", MS, nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_idempotency_keys_run_id_runs"),
        sa.PrimaryKeyConstraint("token_id", "key", name="pk_idempotency_keys"),
    )


def downgrade() -> None:
    for table in (
        "idempotency_keys",
        "api_tokens",
        "receipt_journal",
        "run_events",
        "attempts",
        "runs",
        "secrets",
        "task_revisions",
        "context_recipes",
    ):
        op.drop_table(table)
