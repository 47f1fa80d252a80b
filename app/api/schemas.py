"""Request and response shapes (pydantic shapes I/O only; the rules live in app.domain)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from app.domain.model import (
    Attempt,
    Recipe,
    Run,
    RunEvent,
    Schedule,
    ScheduleDecision,
    ScheduleDefinition,
    TaskRevision,
    Waiting,
)
from app.domain.retention import MAX_KEEP_DAYS, MAX_KEEP_RUNS
from app.domain.validation import NAME_PATTERN, PRIORITY_MAX, PRIORITY_MIN


def _utf8_encodable(value: str) -> str:
    # JSON may carry lone surrogates ("\ud800"); they cannot be stored or passed to a process.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (no lone surrogates)") from None
    return value


Text = Annotated[str, AfterValidator(_utf8_encodable)]
Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]
RunStatusName = Literal[
    "queued", "dispatching", "running", "succeeded", "failed", "cancelled", "timed_out", "lost"
]
AttemptStatusName = Literal[
    "claimed", "starting", "running", "succeeded", "failed", "cancelled", "timed_out", "lost"
]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Problem(BaseModel):
    """RFC 9457 problem details with a stable ``code``."""

    type: str
    title: str
    status: int
    detail: str
    code: str


# -- definitions ------------------------------------------------------------------------------


class RecipeIn(_In):
    env: dict[Text, Text] = Field(default_factory=dict)
    secrets: dict[Text, Text] = Field(default_factory=dict)


class RecipeOut(BaseModel):
    id: str
    env: dict[str, str]
    secrets: dict[str, str]
    created_at_ms: int

    @classmethod
    def of(cls, r: Recipe) -> RecipeOut:
        return cls(id=r.id, env=r.env, secrets=r.secrets, created_at_ms=r.created_at_ms)


RetryOn = Literal["failed", "timed_out", "lost"]


class RetryIn(_In):
    """A revision's retry policy (docs/retries.md); bounds are checked by the domain
    (422 INVALID_RETRY_POLICY)."""

    max_attempts: int = Field(default=1, description="1..20 attempts in all; 1: no retry")
    initial_delay_seconds: float = Field(
        default=10, description="0..86400: the wait after attempt 1"
    )
    factor: float = Field(default=2.0, description="1..10: each wait is the previous times this")
    max_delay_seconds: float = Field(
        default=600, description="0..86400, at least initial_delay_seconds: the cap of a wait"
    )
    jitter: bool = Field(
        default=False,
        description="draw each wait uniformly in the upper half of its backoff (once, stored)",
    )
    on: list[Text] = Field(
        default=["failed"],
        description="the attempt endings that are retried, of failed, timed_out, lost; lost "
        "only when its processes are proven gone",
    )


class RetryOut(BaseModel):
    max_attempts: int
    initial_delay_seconds: float
    factor: float
    max_delay_seconds: float
    jitter: bool
    on: list[RetryOn]


class RevisionIn(_In):
    executor: Literal["local_process"] = "local_process"
    argv: list[Text] = Field(min_length=1)
    cwd: Text | None = None
    recipe: Text | None = None
    timeout_seconds: Int32 | None = None
    priority: Int32 = 0
    leftovers: Literal["kill", "keep"] = Field(
        default="kill",
        description=(
            "What happens to the job's other processes when its main process ends, or when "
            "it is cancelled or timed out: kill (default; its process group and its own "
            "cgroup where the host has one) or keep (they run on, ownerless)."
        ),
    )
    run_as: Text | None = Field(
        default=None,
        description=(
            "The OS user the job runs as: one of the users the operator allowed with "
            "QL_JOB_USERS (else 422 RUN_AS_NOT_ALLOWED). Absent: the default job user "
            "(QL_JOB_USER), or the service's own user when none is configured."
        ),
    )
    max_concurrent: Int32 | None = Field(
        default=None,
        description=(
            "At most this many runs of the task (of any revision) are dispatching or running "
            "at once while this revision's run waits, 1..1000 (else 422 LIMIT_EXCEEDED); "
            "absent: no per-task limit, only QL_MAX_RUNNING (docs/concurrency-budgets.md)."
        ),
    )
    retry: RetryIn | None = Field(
        default=None,
        description="Run a new attempt after a failed one (docs/retries.md); absent: never.",
    )


class RevisionOut(BaseModel):
    task: str
    revision: int
    executor: str
    argv: list[str]
    cwd: str | None
    recipe: str | None
    timeout_seconds: int | None
    priority: int
    leftovers: Literal["kill", "keep"]
    run_as: str | None = None
    max_concurrent: int | None = None
    retry: RetryOut | None = None
    digest: str
    created_at_ms: int

    @classmethod
    def of(cls, r: TaskRevision) -> RevisionOut:
        return cls(
            task=r.task,
            revision=r.revision,
            executor=r.executor,
            argv=list(r.argv),
            cwd=r.cwd,
            recipe=r.recipe,
            timeout_seconds=r.timeout_seconds,
            priority=r.priority,
            leftovers=r.leftovers,
            run_as=r.run_as,
            max_concurrent=r.max_concurrent,
            retry=RetryOut.model_validate(r.retry.body()) if r.retry is not None else None,
            digest=r.digest,
            created_at_ms=r.created_at_ms,
        )


class RevisionPage(BaseModel):
    items: list[RevisionOut]
    next_cursor: str | None


class TaskSummary(BaseModel):
    task: str
    latest_revision: int
    archived: bool = Field(description="archived: hidden from the default list, no new run")
    archived_at_ms: int | None = Field(description="when it was archived; null when it is not")


class TaskPage(BaseModel):
    items: list[TaskSummary]
    next_cursor: str | None


class TaskOut(BaseModel):
    task: str
    latest_revision: int
    archived: bool
    archived_at_ms: int | None
    latest: RevisionOut


# -- secrets ------------------------------------------------------------------------------------


class SecretIn(_In):
    value: Text


class SecretOut(BaseModel):
    name: str
    updated_at_ms: int


class SecretPage(BaseModel):
    items: list[SecretOut]
    next_cursor: str | None


class TokenOut(BaseModel):
    """The calling token as its holder may see it: never its value or digest."""

    name: str
    scopes: list[str] = Field(
        description="as granted, sorted; `admin` implies every other scope (docs/api.md §1)"
    )
    expires_at_ms: int | None = Field(description="null: valid until revoked")


# -- runs ---------------------------------------------------------------------------------------


class RunIn(_In):
    # The document states the domain's rules (app/domain/validation.py); the domain enforces
    # them, with their own codes (INVALID_NAME, LIMIT_EXCEEDED), so the schema only says so.
    task: Annotated[Text, Field(json_schema_extra={"pattern": NAME_PATTERN, "maxLength": 128})]
    revision: Annotated[Int32, Field(json_schema_extra={"minimum": 1})] | None = None
    priority: (
        Annotated[
            Int32, Field(json_schema_extra={"minimum": PRIORITY_MIN, "maximum": PRIORITY_MAX})
        ]
        | None
    ) = None


class LogOut(BaseModel):
    bytes: int
    truncated: bool
    dropped_bytes: int
    truncation_reason: Literal["quota", "disk_full", "write_error"] | None = Field(
        default=None,
        description="why bytes were dropped (the log quota, a full disk, another write "
        "error); known once the attempt ended, null otherwise",
    )
    dropped_at: int | None = Field(
        default=None,
        description="the log's byte offset where the dropped bytes were cut out: the log "
        "holds the output before it and, after it, the output's last bytes (equal to bytes "
        "when the log's end is not the output's end: a write failed); known once the "
        "attempt ended, null when nothing was dropped or for an attempt recorded before this "
        "field existed",
    )
    expired: bool = Field(
        default=False,
        description="retention removed the file (GET .../log answers 410 LOG_EXPIRED); "
        "bytes is what it held",
    )
    expired_at_ms: int | None = None


class CancelOut(BaseModel):
    # A string, not an enum: a reason a newer build records must not make this build's
    # answer fail (a rollback, or hosts of two versions on one database). The known ones:
    reason: str = Field(
        description="user, timeout, replaced or schedule_deleted; service_stop is read "
        "(the UI and CLI name it) but not yet written, so a rollback to an older build, "
        "whose answer lists only the first four, stays possible; unknown values may come"
    )
    at_ms: int


class WaitingOut(BaseModel):
    # A string, not an enum, as the cancel reason: a later build may add reasons.
    reason: str = Field(
        description="max_concurrent (its task's limit is reached), held (an older run of "
        "its schedule has not ended), max_running (QL_MAX_RUNNING runs are active: with "
        "several hosts, the answering host's), worker (the answering api's last try found "
        "no worker answering) or disk (its last try found too little free space: /readyz "
        "says which); the first that holds; unknown values may come"
    )
    limit: int | None = Field(default=None, description="the budget, for the first two")
    active: int | None = Field(default=None, description="the runs holding it, for the first two")


class LatestAttemptOut(BaseModel):
    number: int
    status: AttemptStatusName
    exit_code: int | None
    signal: int | None
    error_code: str | None
    started_at_ms: int | None
    finished_at_ms: int | None
    log: LogOut

    @classmethod
    def fields_of(cls, a: Attempt) -> dict[str, object]:
        log = a.log
        return {
            "number": a.number,
            "status": a.status,
            "exit_code": a.exit_code,
            "signal": a.signal,
            "error_code": a.error_code,
            "started_at_ms": a.started_at_ms,
            "finished_at_ms": a.finished_at_ms,
            "log": LogOut(
                bytes=log.bytes if log else 0,
                truncated=log.truncated if log else False,
                dropped_bytes=log.dropped_bytes if log else 0,
                truncation_reason=log.reason if log else None,
                dropped_at=log.dropped_at if log else None,
                expired=log.expired if log else False,
                expired_at_ms=log.expired_at_ms if log else None,
            ),
        }

    @classmethod
    def of(cls, a: Attempt) -> LatestAttemptOut:
        return cls.model_validate(cls.fields_of(a))


class AttemptOut(LatestAttemptOut):
    id: str
    created_at_ms: int
    deadline_at_ms: int | None
    not_before_ms: int | None = Field(
        default=None, description="a retry: the attempt does not start before this instant"
    )

    @classmethod
    def of(cls, a: Attempt) -> AttemptOut:
        return cls.model_validate(
            {
                **cls.fields_of(a),
                "id": a.id,
                "created_at_ms": a.created_at_ms,
                "deadline_at_ms": a.deadline_at_ms,
                "not_before_ms": a.not_before_ms,
            }
        )


class AttemptPage(BaseModel):
    items: list[AttemptOut]
    next_cursor: str | None


class TriggerOut(BaseModel):
    kind: Literal["manual", "schedule"]
    schedule: str | None
    slot_ms: int | None
    rerun_of: str | None = Field(
        default=None, description="the run this one repeats (POST /api/v1/runs/{id}/rerun)"
    )


class RunOut(BaseModel):
    id: str
    task: str
    revision: int
    status: RunStatusName
    priority: int
    version: int
    created_at_ms: int
    started_at_ms: int | None
    finished_at_ms: int | None
    cancel_requested: CancelOut | None
    latest_attempt: LatestAttemptOut | None
    trigger: TriggerOut
    attempts: int = Field(description="how many attempts the run has had (retries included)")
    next_attempt_at_ms: int | None = Field(
        default=None, description="a retry waits in the queue: it does not start before this"
    )
    pinned: bool = Field(
        default=False, description="kept against every retention policy (docs/retention.md)"
    )
    waiting: WaitingOut | None = Field(
        default=None,
        description="why a queued run has not started, when a budget or its schedule holds "
        "it (docs/concurrency-budgets.md); given by GET /api/v1/runs/{run_id} only, null in "
        "lists and whenever nothing holds it back",
    )

    @classmethod
    def of(cls, r: Run, waiting: Waiting | None = None) -> RunOut:
        cancel = None
        if r.cancel is not None:
            cancel = CancelOut.model_validate({"reason": r.cancel.reason, "at_ms": r.cancel.at_ms})
        return cls.model_validate(
            {
                "id": r.id,
                "task": r.task,
                "revision": r.revision,
                "status": r.status,
                "priority": r.priority,
                "version": r.version,
                "created_at_ms": r.created_at_ms,
                "started_at_ms": r.started_at_ms,
                "finished_at_ms": r.finished_at_ms,
                "cancel_requested": cancel,
                "latest_attempt": (
                    LatestAttemptOut.of(r.latest_attempt) if r.latest_attempt else None
                ),
                "trigger": TriggerOut(
                    kind=r.trigger_kind,
                    schedule=r.schedule,
                    slot_ms=r.slot_ms,
                    rerun_of=r.rerun_of,
                ),
                "attempts": r.attempts,
                "next_attempt_at_ms": r.next_attempt_at_ms,
                "pinned": r.pinned,
                "waiting": (
                    None
                    if waiting is None
                    else WaitingOut(
                        reason=waiting.reason, limit=waiting.limit, active=waiting.active
                    )
                ),
            }
        )


class RunPage(BaseModel):
    items: list[RunOut]
    next_cursor: str | None


class EventOut(BaseModel):
    seq: int
    type: str
    at_ms: int
    data: dict[str, object]

    @classmethod
    def of(cls, e: RunEvent) -> EventOut:
        return cls(seq=e.seq, type=e.type, at_ms=e.at_ms, data=e.data)


class EventPage(BaseModel):
    items: list[EventOut]
    next_cursor: str | None


# -- operations ---------------------------------------------------------------------------------


class Health(BaseModel):
    status: Literal["ok"]


# app/worker/process_limit.py HELD_BY (the api does not import the worker; a test keeps them one).
HeldBy = Literal["off", "pids_max", "rlimit_nproc", "rlimit_nproc_run_as", "none"]


class ProcessLimit(BaseModel):
    max_processes: int | None = Field(
        description="QL_JOB_MAX_PROCESSES: processes and threads a job may have at once; "
        "null: off"
    )
    held_by: HeldBy = Field(
        description=(
            "How the worker holds it (docs/job-user.md, Process limit): pids_max (each job "
            "with its own cgroup, by its pids.max), rlimit_nproc (per job user, across that "
            "user's running jobs), rlimit_nproc_run_as (the same for run_as jobs only: the "
            "others have none), none (not enforced: a job can start processes without bound), "
            "off (no limit set)."
        )
    )


class Ready(BaseModel):
    status: Literal["ready"]
    checks: dict[str, str]
    isolation: Literal["job_user", "same_user"] = Field(
        default="same_user",
        description=(
            "Who jobs run as by default: job_user (QL_JOB_USER, a separate OS user that "
            "cannot read the data dir) or same_user (the service's own user; docs/job-user.md)."
        ),
    )
    process_limit: ProcessLimit | None = Field(
        default=None,
        description=(
            "The job process limit as the worker said it holds when it started: a fact to "
            "read, never a reason for 503. null when this api starts no runs, or its worker "
            "is of a build that does not say."
        ),
    )


# -- schedules (docs/schedules.md) --------------------------------------------------------------

Ms = Annotated[int, Field(ge=0, le=2**62)]


class ScheduleIn(_In):
    task: Text
    revision: Annotated[int, Field(ge=1, le=2**31 - 1)] | None = None
    cron: list[Text] | None = Field(
        default=None,
        description="1..8 cron expressions (a union); exactly one of cron and every_seconds",
    )
    every_seconds: Int32 | None = Field(
        default=None, description=">= 1, slots aligned to the epoch"
    )
    timezone: Text = Field(default="UTC", description="an IANA time zone name")
    overlap: Literal["skip", "allow", "queue_one", "replace"] = "skip"
    max_concurrent: Annotated[int, Field(ge=1, le=1000)] = 1
    catchup: Literal["latest", "all", "none"] = "latest"
    catchup_window_seconds: Annotated[int, Field(ge=0, le=10**8)] = 3600
    jitter_seconds: Annotated[int, Field(ge=0, le=86400)] = 0
    dst_gap: Literal["shift", "skip"] = "shift"
    dst_fold: Literal["first", "both"] = "first"
    start_at_ms: Ms | None = None
    end_at_ms: Ms | None = None
    paused: bool = False

    def definition(self) -> ScheduleDefinition:
        """The domain value of the body (``paused`` apart)."""
        return ScheduleDefinition(
            task=self.task,
            revision=self.revision,
            cron=tuple(self.cron) if self.cron is not None else None,
            every_seconds=self.every_seconds,
            timezone=self.timezone,
            overlap=self.overlap,
            max_concurrent=self.max_concurrent,
            catchup=self.catchup,
            catchup_window_seconds=self.catchup_window_seconds,
            jitter_seconds=self.jitter_seconds,
            dst_gap=self.dst_gap,
            dst_fold=self.dst_fold,
            start_at_ms=self.start_at_ms,
            end_at_ms=self.end_at_ms,
        )


class NextFireOut(BaseModel):
    at_ms: int
    local: str = Field(description="ISO 8601 in the schedule's zone with its UTC offset")


class ScheduleOut(BaseModel):
    name: str
    task: str
    revision: int | None
    cron: list[str] | None
    every_seconds: int | None
    timezone: str
    overlap: str
    max_concurrent: int
    catchup: str
    catchup_window_seconds: int
    jitter_seconds: int
    dst_gap: str
    dst_fold: str
    start_at_ms: int | None
    end_at_ms: int | None
    paused: bool
    version: int
    created_at_ms: int
    updated_at_ms: int
    next_fires: list[NextFireOut]

    @classmethod
    def of(cls, s: Schedule, next_fires: list[NextFireOut]) -> ScheduleOut:
        return cls.model_validate(
            {
                "name": s.name,
                **s.definition.body(),
                "paused": s.paused,
                "version": s.version,
                "created_at_ms": s.created_at_ms,
                "updated_at_ms": s.updated_at_ms,
                "next_fires": next_fires,
            }
        )


class SchedulePage(BaseModel):
    items: list[ScheduleOut]
    next_cursor: str | None


class DecisionOut(BaseModel):
    slot_ms: int
    decision: Literal[
        "fired", "skipped_overlap", "queued", "replaced", "missed", "dropped_queue_full"
    ]
    run: str | None = Field(description="the run fired, or the blocking run of a skip")
    count: int = Field(description="slots this decision covers (missed: collapsed)")
    until_slot_ms: int | None
    at_ms: int

    @classmethod
    def of(cls, d: ScheduleDecision) -> DecisionOut:
        return cls.model_validate(
            {
                "slot_ms": d.slot_ms,
                "decision": d.decision,
                "run": d.run_id,
                "count": d.count,
                "until_slot_ms": d.until_slot_ms,
                "at_ms": d.at_ms,
            }
        )


class DecisionPage(BaseModel):
    items: list[DecisionOut]
    next_cursor: str | None


# -- retention (docs/retention.md) ---------------------------------------------------------------

NonNegInt = Annotated[int, Field(ge=0, le=2**62)]


class RetentionIn(_In):
    # The bounds are the domain's (app/domain/retention.py), so the document promises
    # exactly what is accepted.
    keep_runs: Annotated[int, Field(ge=0, le=MAX_KEEP_RUNS)] | None = Field(
        default=None, description="the newest runs that keep their logs; null: the global value"
    )
    keep_days: Annotated[int, Field(ge=0, le=MAX_KEEP_DAYS)] | None = Field(
        default=None, description="runs younger than this keep their logs (0: none by age)"
    )
    keep_rows: Annotated[int, Field(ge=1, le=MAX_KEEP_RUNS * 10)] | None = Field(
        default=None, description="the newest runs that keep their rows (more than keep_runs)"
    )
    task_log_bytes: NonNegInt | None = Field(
        default=None, description="log bytes this task may keep"
    )


class RetentionPolicyOut(BaseModel):
    keep_runs: int
    keep_days: int
    keep_rows: int
    task_log_bytes: int | None


class RetentionOut(BaseModel):
    task: str
    override: RetentionIn
    effective: RetentionPolicyOut
    retention_enabled: bool = Field(
        description="false under QL_RETENTION=off: no sweep runs, effective is applied to nothing"
    )


class SweepOut(BaseModel):
    at_ms: int
    duration_ms: int
    expired_logs: int
    finished_expiring: int
    deleted_runs: int
    freed_bytes: int
    # With several hosts, whose sweep it was (its lease's instance and host name); null on
    # one host (SQLite) and for a row an older build wrote.
    instance_id: str | None = None
    host: str | None = None


class StorageOut(BaseModel):
    retention_enabled: bool
    log_bytes: int
    logs_kept: int
    logs_expired: int
    runs_kept: int
    free_bytes: int | None
    reserve_bytes: int
    total_log_bytes_budget: int | None
    last_sweep: SweepOut | None
    # Each host's last sweep, newest first (one on one host): a host whose sweeps stopped
    # is the oldest here.
    sweeps: list[SweepOut]
