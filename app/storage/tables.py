"""The one MetaData of the service. Times are integer milliseconds since the epoch."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    literal_column,
    text,
)

from app.domain.states import AttemptStatus, RunStatus

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

ID = String(36)  # UUIDv7 text
MS = BigInteger

task_revisions = Table(
    "task_revisions",
    metadata,
    Column("task", String(128), primary_key=True),
    Column("revision", Integer, primary_key=True),
    Column("digest", String(71), nullable=False),
    Column("executor", String(32), nullable=False),
    Column("body", Text, nullable=False),  # canonical JSON of the definition
    Column("recipe_id", String(82), ForeignKey("context_recipes.id"), nullable=True),
    Column("timeout_seconds", Integer, nullable=True),
    Column("priority", Integer, nullable=False),
    Column("created_at_ms", MS, nullable=False),
)

context_recipes = Table(
    "context_recipes",
    metadata,
    Column("id", String(82), primary_key=True),  # localctx:sha256:<64 hex>
    Column("body", Text, nullable=False),
    Column("created_at_ms", MS, nullable=False),
)

secrets = Table(
    "secrets",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("key_id", String(64), nullable=False),
    Column("nonce", LargeBinary, nullable=False),
    Column("ciphertext", LargeBinary, nullable=False),
    Column("created_at_ms", MS, nullable=False),
    Column("updated_at_ms", MS, nullable=False),
)

# The predicate of ix_runs_ready_page, which the page query repeats, with the status as a
# literal: a planner proves a partial index usable from the query's own terms, and a bound
# parameter proves nothing (PostgreSQL's generic plan sees no value).
READY_PAGE_WHERE = f"status = '{RunStatus.QUEUED.value}' AND not_before_ms IS NULL"
# The predicate of ix_runs_retry_wait, repeated the same way by the reads that walk it: the
# queued runs that wait for a retry's instant (docs/retries.md §2).
RETRY_WAIT_WHERE = f"status = '{RunStatus.QUEUED.value}' AND not_before_ms IS NOT NULL"
# The predicate of the schedule indexes: a run no schedule made is in neither (migration
# 0010). A lookup by ``schedule_id = x`` implies it, on both engines.
SCHEDULED_WHERE = "schedule_id IS NOT NULL"
SCHEDULE_NAMED_WHERE = "schedule_name IS NOT NULL"
# The predicate of the attempt indexes by status (migration 0011): every read of them asks
# for the attempts starting or running, and an attempt is in that state only between T1 and
# its ending; its insert (claimed) and its ending (terminal) write none of them.
ACTIVE_ATTEMPT_STATUSES = (AttemptStatus.STARTING.value, AttemptStatus.RUNNING.value)
ACTIVE_ATTEMPT_WHERE = f"status IN ({', '.join(repr(s) for s in ACTIVE_ATTEMPT_STATUSES)})"


def _partial(where: str) -> dict[str, Any]:
    """The keywords of an index holding only the rows that meet ``where``, on both engines."""
    return {"postgresql_where": text(where), "sqlite_where": text(where)}


runs = Table(
    "runs",
    metadata,
    Column("id", ID, primary_key=True),
    Column("task", String(128), nullable=False),
    Column("revision", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("priority", Integer, nullable=False),
    # Compare-and-set fence; equals the seq of the run's newest event.
    Column("version", Integer, nullable=False),
    Column("latest_attempt", Integer, nullable=False),
    Column("created_at_ms", MS, nullable=False),
    Column("started_at_ms", MS, nullable=True),
    Column("finished_at_ms", MS, nullable=True),
    Column("cancel_reason", String(16), nullable=True),
    Column("cancel_requested_at_ms", MS, nullable=True),
    # What started the run (migration 0004, docs/schedules.md): manual or schedule. The name
    # is kept beside the id so a run still names its schedule after the schedule is deleted.
    Column("trigger_kind", String(16), nullable=False, server_default="manual"),
    Column("schedule_id", ID, nullable=True),
    Column("schedule_name", String(128), nullable=True),
    Column("slot_ms", MS, nullable=True),
    # Overlap queue_one / replace (migration 0007, docs/schedules.md §5): not dispatched while
    # a run of the schedule with a slot in [hold_from_slot_ms, slot_ms) has not ended.
    Column("hold_from_slot_ms", MS, nullable=True),
    # The run a rerun repeats (migration 0005, docs/retries.md §5); no foreign key, so a
    # rerun outlives the deletion of the run it repeats.
    Column("rerun_of", ID, nullable=True),
    # Set while the run waits for a retry's instant (migration 0005, docs/retries.md §2);
    # NULL once it is due (the dispatch drain clears it) and for every other run.
    Column("not_before_ms", MS, nullable=True),
    # A pinned run keeps its log and rows against every retention policy (migration 0006).
    Column("pinned", Boolean, nullable=False, server_default=false()),
    # The dispatch page's walk (docs/design.md §3.3, migration 0009): the queued runs that
    # wait for no retry, in exactly the page's order (priority DESC, created, id), so a page
    # reads its own rows under any plan, the generic plan of a hot prepared statement
    # included, and never the queue. Waiting retries are not in it, so they never lengthen
    # a walk; a run leaves it at T1, so no later transition of the run writes to it.
    Index(
        "ix_runs_ready_page",
        text("priority DESC"),
        "created_at_ms",
        "id",
        **_partial(READY_PAGE_WHERE),
    ),
    # Runs waiting for a retry, by instant: the range not_before_ms > now gives the earliest
    # one, <= now the due ones (docs/retries.md §2). Partial, like the ones below (migration
    # 0010): a run enters it only while it waits for a retry, so an ordinary run's
    # transitions never write to it (each UPDATE of a run that changes its status writes a
    # new entry into every index whose predicate the new row meets).
    Index(
        "ix_runs_retry_wait",
        "not_before_ms",
        **_partial(RETRY_WAIT_WHERE),
    ),
    Index("ix_runs_task_id", "task", "id"),
    Index("ix_runs_status_id", "status", "id"),
    Index("ix_runs_task_status_id", "task", "status", "id"),
    # One slot of a schedule can never have two runs (docs/schedules.md §2).
    Index(
        "ix_runs_schedule_id_slot_ms",
        "schedule_id",
        "slot_ms",
        unique=True,
        **_partial(SCHEDULED_WHERE),
    ),
    # A schedule's runs by name, newest first: GET /api/v1/runs?schedule= (migration 0014).
    Index(
        "ix_runs_schedule_name_id",
        "schedule_name",
        "id",
        **_partial(SCHEDULE_NAMED_WHERE),
    ),
    # A schedule's runs not ended, read by every fire inside the writer lock: without it the
    # read walks every run the schedule ever had (86,400 a day for an every-second one).
    Index(
        "ix_runs_schedule_id_status",
        "schedule_id",
        "status",
        **_partial(SCHEDULED_WHERE),
    ),
)

attempts = Table(
    "attempts",
    metadata,
    Column("id", ID, primary_key=True),
    Column("run_id", ID, ForeignKey("runs.id"), nullable=False),
    Column("number", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("executor", String(32), nullable=False),
    Column("created_at_ms", MS, nullable=False),
    Column("started_at_ms", MS, nullable=True),
    Column("finished_at_ms", MS, nullable=True),
    Column("exit_code", Integer, nullable=True),
    Column("signal", Integer, nullable=True),
    Column("error_code", String(64), nullable=True),
    Column("callback_token_digest", String(71), nullable=True),
    Column("callback_sequence", Integer, nullable=False),
    Column("deadline_at_ms", MS, nullable=True),
    Column("log_artifact_id", String(64), nullable=True),
    Column("log_bytes", BigInteger, nullable=True),
    Column("log_truncated", Boolean, nullable=True),
    Column("log_dropped_bytes", BigInteger, nullable=True),
    Column("handle", Text, nullable=True),  # JSON durable identity; never exposed by the API
    # quota | disk_full | write_error, from the shim's truncation fact (migration 0003)
    Column("log_truncation_reason", String(16), nullable=True),
    # The log's offset where dropped bytes were cut out; the output's tail follows it
    # (migration 0016, docs/disk-full-and-readiness.md). NULL before, or nothing dropped.
    Column("log_dropped_at", BigInteger, nullable=True),
    # A retry's attempt does not start before this (migration 0005, docs/retries.md).
    Column("not_before_ms", MS, nullable=True),
    # Retention (migration 0006, docs/retention.md §3): NULL while the log is there (or never
    # was), "expiring" from before its unlink until it is durable, then "expired".
    Column("log_state", String(16), nullable=True),
    Column("log_expired_at_ms", MS, nullable=True),
    # The worker instance and lease epoch that launched it (migration 0008,
    # docs/several-hosts.md): only that instance's worker reconciles, times out or stops it.
    Column("worker_instance_id", ID, nullable=True),
    Column("lease_epoch", BigInteger, nullable=True),
    UniqueConstraint("run_id", "number"),
    # Partial: the attempts starting or running only (ACTIVE_ATTEMPT_WHERE, migration 0011).
    Index(
        "ix_attempts_status_id",
        "status",
        "id",
        **_partial(ACTIVE_ATTEMPT_WHERE),
    ),
    Index(
        "ix_attempts_status_deadline_at_ms",
        "status",
        "deadline_at_ms",
        **_partial(ACTIVE_ATTEMPT_WHERE),
    ),
    Index(
        "ix_attempts_worker_instance_id_status",
        "worker_instance_id",
        "status",
        **_partial(ACTIVE_ATTEMPT_WHERE),
    ),
    # Partial: only the few expiring/expired rows. A plain index on a column that is NULL for
    # almost every row tempted PostgreSQL (before it had statistics on the new column) into
    # bitmap-scanning it for every candidate of the sweep.
    Index(
        "ix_attempts_log_state",
        "log_state",
        **_partial("log_state IS NOT NULL"),
    ),
)

run_events = Table(
    "run_events",
    metadata,
    Column("run_id", ID, ForeignKey("runs.id"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("type", String(48), nullable=False),
    Column("at_ms", MS, nullable=False),
    Column("data", Text, nullable=False),  # low-sensitivity canonical JSON only
)

# ACTIVE_ATTEMPT_WHERE as a read's term: the column qualified (a read may join runs, whose
# status is another), the statuses literals, as the index's predicate has them.
ACTIVE_ATTEMPT = attempts.c.status.in_([literal_column(repr(s)) for s in ACTIVE_ATTEMPT_STATUSES])

receipt_journal = Table(
    "receipt_journal",
    metadata,
    Column("attempt_id", ID, primary_key=True),
    Column("run_id", ID, nullable=False),
    # reserved -> spawned -> consumed | quarantined | spawn_failed
    Column("state", String(16), nullable=False),
    Column("receipt_ref", String(128), nullable=False),  # relative to the receipts root
    Column("handle", Text, nullable=True),
    Column("quarantine_reason", String(32), nullable=True),
    Column("created_at_ms", MS, nullable=False),
    Column("updated_at_ms", MS, nullable=False),
    # The worker instance that wrote the entry (migration 0008): its host holds the files.
    Column("worker_instance_id", ID, nullable=True),
    Index("ix_receipt_journal_state_updated_at_ms", "state", "updated_at_ms"),
)

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", ID, primary_key=True),
    Column("name", String(128), nullable=False, unique=True),
    Column("digest", String(71), nullable=False, unique=True),
    Column("scopes", Text, nullable=False),  # space separated
    Column("created_at_ms", MS, nullable=False),
    Column("revoked_at_ms", MS, nullable=True),
    Column("expires_at_ms", MS, nullable=True),  # None: never (migration 0012)
)

idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("token_id", ID, primary_key=True),
    Column("key", String(255), primary_key=True),
    Column("request_digest", String(71), nullable=False),
    Column("run_id", ID, ForeignKey("runs.id"), nullable=False),
    Column("created_at_ms", MS, nullable=False),
)

# The worker lease (docs/worker-lease.md, docs/several-hosts.md): one row per slot. SQLite
# has one slot, ``worker``; on PostgreSQL every instance has its own row (the slot is its
# instance id). Every change of holder bumps ``epoch`` (the compare-and-set fence). Times
# are the database's clock.
worker_leases = Table(
    "worker_leases",
    metadata,
    Column("slot", String(32), primary_key=True),
    Column("instance_id", ID, nullable=False),
    Column("host", String(255), nullable=False),
    Column("boot_id", String(64), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("start_ticks", BigInteger, nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("acquired_at_ms", MS, nullable=False),
    Column("renewed_at_ms", MS, nullable=False),
    Column("expires_at_ms", MS, nullable=False),
    Column("released_at_ms", MS, nullable=True),
    # The holder's api, for log reads from other hosts (migration 0008).
    Column("base_url", String(255), nullable=True),
)

# Append-only history of the service itself (not of one run): lease acquisitions, takeovers
# and releases. Content-free canonical JSON (instance ids, hosts, epochs, times).
service_events = Table(
    "service_events",
    metadata,
    Column("id", ID, primary_key=True),  # UUIDv7: time-ordered
    Column("type", String(48), nullable=False),
    Column("at_ms", MS, nullable=False),
    Column("data", Text, nullable=False),
)

# Schedules (docs/schedules.md). ``cursor_ms`` is the durable cursor: every slot at or before
# it has been decided. ``next_due_ms`` is the earliest slot still to decide (NULL when paused
# or ended): the loop's one indexed query sleeps until its minimum.
schedules = Table(
    "schedules",
    metadata,
    Column("id", ID, primary_key=True),
    Column("name", String(128), nullable=False, unique=True),
    Column("body", Text, nullable=False),  # canonical JSON of the definition
    Column("version", Integer, nullable=False),
    Column("cursor_ms", MS, nullable=False),
    Column("next_due_ms", MS, nullable=True),
    Column("paused", Boolean, nullable=False),
    Column("created_at_ms", MS, nullable=False),
    Column("updated_at_ms", MS, nullable=False),
    Index("ix_schedules_next_due_ms", "next_due_ms"),
)

# What became of each slot: fired, skipped_overlap, missed (collapsed over a range), ...
schedule_decisions = Table(
    "schedule_decisions",
    metadata,
    Column("id", ID, primary_key=True),  # UUIDv7: the keyset order, newest first
    Column("schedule_id", ID, nullable=False),
    Column("slot_ms", MS, nullable=False),
    Column("decision", String(24), nullable=False),
    Column("run_id", ID, nullable=True),
    Column("count", Integer, nullable=False),
    Column("until_slot_ms", MS, nullable=True),
    Column("at_ms", MS, nullable=False),
    Index("ix_schedule_decisions_schedule_id_id", "schedule_id", text("id DESC")),
)

# Retention (docs/retention.md): a task's own policy fields (NULL: the global value), and the
# last sweep's figures (one row per sweeper: ``logs`` on SQLite's one host, each host's
# instance id with several, migration 0013), read by GET /api/v1/system/storage.
task_retention = Table(
    "task_retention",
    metadata,
    Column("task", String(128), primary_key=True),
    Column("keep_runs", Integer, nullable=True),
    Column("keep_days", Integer, nullable=True),
    Column("keep_rows", Integer, nullable=True),
    Column("task_log_bytes", BigInteger, nullable=True),
    Column("updated_at_ms", MS, nullable=False),
)

# Archived tasks (docs/api.md §4, migration 0015): a row per task ever archived.
# ``archived_at_ms`` is the state: when the task was archived, NULL once unarchived (a task
# without a row is not archived either); ``version`` is the compare-and-set fence.
task_archive = Table(
    "task_archive",
    metadata,
    Column("task", String(128), primary_key=True),
    Column("archived_at_ms", MS, nullable=True),
    Column("version", Integer, nullable=False),
    Column("updated_at_ms", MS, nullable=False),
)

retention_sweeps = Table(
    "retention_sweeps",
    metadata,
    Column("sweeper", String(40), primary_key=True),
    Column("at_ms", MS, nullable=False),
    Column("duration_ms", MS, nullable=False),
    Column("expired_logs", Integer, nullable=False),
    Column("finished_expiring", Integer, nullable=False),
    Column("deleted_runs", Integer, nullable=False),
    Column("freed_bytes", BigInteger, nullable=False),
    Column("log_bytes", BigInteger, nullable=False),
    Column("free_bytes", BigInteger, nullable=True),
)
