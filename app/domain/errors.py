"""Every exception the application raises across a layer, and the stable codes they carry.

One list of what can go wrong. The classes are pure (standard library, no I/O), so the
adapters (``app.storage``, ``app.worker``) raise them and the execution layer catches them
through its ports without importing an adapter. One refusal has one type, whichever layer
noticed it: a transition the state machine refuses and one the repository refuses are both
``InvalidTransition``. Each port method (app/execution/ports.py) names in its ``Raises:``
line which of these it raises. The api turns them into problem+json in app/api/problems.py
(status in brackets)::

    Exception
    ├── DomainError(code, detail)     a refusal; ``detail`` is safe to show         [400]
    │   ├── ValidationFailed          input broke a rule                             [422]
    │   │   ├── InvalidSchedule       a schedule definition (INVALID_SCHEDULE)       [422]
    │   │   └── InvalidTimezone       not an IANA zone (INVALID_TIMEZONE)            [422]
    │   ├── NotFound                  a referenced resource does not exist           [404]
    │   │   └── SecretsMissing        secrets a recipe names are not stored (names)  [404]
    │   ├── Gone                      it existed and is gone (LOG_EXPIRED, LOG_MISSING) [410]
    │   ├── Conflict                  contradicts what is stored                     [409]
    │   │   └── InvalidTransition     a state change refused (INVALID_TRANSITION)    [409]
    │   ├── VersionConflict           a compare-and-set lost (VERSION_CONFLICT)      [409]
    │   ├── PreconditionFailed        If-Match names another version                 [412]
    │   ├── NotMigrated               the schema is not the newest (NOT_MIGRATED)
    │   ├── QueueFull                 QL_MAX_QUEUED runs are queued (QUEUE_FULL)      [429]
    │   ├── LeaseHeld                 another live worker holds the lease
    │   ├── LeaseLost                 this worker lost the lease: it stops serving
    │   └── LogHostUnavailable        the attempt's host does not answer its log     [503]
    ├── StorageUnavailable            the database cannot commit now, not a refusal  [503]
    │   ├── DatabaseUnreachable       the connection was lost or could not be opened [503]
    │   └── DatabaseBusy              a write lock or every pooled connection busy   [503]
    ├── KeyUnavailable                a secret does not decrypt under the key ring
    ├── AdmissionRefused(scope)       a concurrency budget is used up: the run waits
    ├── LaunchFailed(reason)          the launch ended, nothing is left running
    │   ├── LaunchRejected            the attempt is journaled or fenced already
    │   └── LaunchUnavailable         provably nothing spawned (the run is requeued)
    │       └── WorkerUnavailable     the worker socket did not answer or refused
    ├── LaunchOutcomeUnknown(reason)  a process may exist: recovery decides, never a guess
    └── ValueError
        └── ReceiptInvalid(reason)    a receipt to quarantine (content-free reason)

The second level: exceptions that never cross a port stay beside the module that raises
them; only code that imports that module directly catches them (its own layer, or the CLI
that built the adapter). They are listed here, not defined here:

- app/execution/materializer.py: CandidateGone, RunFailedBeforeStart, ArtifactRefused
  (caught by the dispatcher);
- app/storage/journal_repo.py: NotStarting, AlreadyReserved (caught by the worker's
  launcher, which owns the journal); app/storage/private_files.py: NotPrivate(ValueError)
  (the CLI's start-up check); app/storage/durable.py: CannotMake (a file, directory or
  socket a start needs could not be made: a full disk, a read-only mount; the CLI's one
  line); app/storage/uow.py: GroupCommitFailed (a SQLite group's
  shared commit failed for a reason other than storage: like any failed commit, nothing of
  the unit was kept);
- app/worker/zygote.py: ZygoteUnavailable, NotReceived, Uncertain, ForkFailed (caught by
  the launcher); app/worker/server.py: BadRequest, SocketInUse(RuntimeError) (the CLI's
  start-up); app/worker/shim.py: ShimError, _Clone3Refused (the shim imports nothing from app);
  app/adapters/worker_client.py: _Broken; app/worker/job_user.py: JobUserUnavailable(ValueError)
  (the CLI's start-up);
- app/api/problems.py: ApiProblem, DuplicateKey (HTTP answers); app/api/asgi.py:
  _Disconnected; app/api/routes_logs.py: _Refused (a follow's token refused, its stream's
  error event); app/cli/shard_audit.py: AuditRefused; app/cli/common.py: NoDatabase (no
  SQLite file where a service command looks), NotTheOwner(ValueError) (root on another
  user's data dir), KeyFileMissing (no key file while the database holds secrets),
  ApiCannotStart (a step of ``qinglong api``/``serve`` before uvicorn raised);
  app/cli/client/api.py: ClientError, Unreachable, ApiProblem (the HTTP client's one-line
  errors); app/cli/client/config.py: ConfigRefused.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import TYPE_CHECKING

from app.domain.ids import utc_instant

if TYPE_CHECKING:
    from app.domain.lease import Lease


class ErrorCode(StrEnum):
    """Stable UPPER_SNAKE codes shared by the API, events and the CLI."""

    VALIDATION_FAILED = "VALIDATION_FAILED"
    INVALID_ARGV = "INVALID_ARGV"
    INVALID_ENV_KEY = "INVALID_ENV_KEY"
    INVALID_ENV_VALUE = "INVALID_ENV_VALUE"
    RESERVED_ENV_KEY = "RESERVED_ENV_KEY"
    DUPLICATE_ENV_KEY = "DUPLICATE_ENV_KEY"
    INVALID_NAME = "INVALID_NAME"
    INVALID_CWD = "INVALID_CWD"
    RUN_AS_NOT_ALLOWED = "RUN_AS_NOT_ALLOWED"
    # A revision's ``retry`` object breaks a rule (docs/retries.md §1).
    INVALID_RETRY_POLICY = "INVALID_RETRY_POLICY"
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
    REVISION_CONFLICT = "REVISION_CONFLICT"
    RECIPE_CONFLICT = "RECIPE_CONFLICT"
    RECIPE_NOT_FOUND = "RECIPE_NOT_FOUND"
    TASK_NOT_FOUND = "TASK_NOT_FOUND"
    # The task is archived: no new run, revision or active schedule (docs/api.md §4).
    TASK_ARCHIVED = "TASK_ARCHIVED"
    # An archive refused while schedules that are not paused name the task.
    TASK_HAS_SCHEDULES = "TASK_HAS_SCHEDULES"
    REVISION_NOT_FOUND = "REVISION_NOT_FOUND"
    RUN_NOT_FOUND = "RUN_NOT_FOUND"
    ATTEMPT_NOT_FOUND = "ATTEMPT_NOT_FOUND"
    SECRET_NOT_FOUND = "SECRET_NOT_FOUND"
    # This host's key ring does not decrypt a secret (docs/several-hosts.md §6).
    SECRET_KEY_UNAVAILABLE = "SECRET_KEY_UNAVAILABLE"
    RUN_TERMINAL = "RUN_TERMINAL"
    IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
    INVALID_TRANSITION = "INVALID_TRANSITION"
    VERSION_CONFLICT = "VERSION_CONFLICT"
    INVALID_CURSOR = "INVALID_CURSOR"
    STORAGE_UNAVAILABLE = "STORAGE_UNAVAILABLE"
    DATABASE_UNREACHABLE = "DATABASE_UNREACHABLE"
    DATABASE_BUSY = "DATABASE_BUSY"
    # Schedules (docs/schedules.md).
    INVALID_SCHEDULE = "INVALID_SCHEDULE"
    INVALID_TIMEZONE = "INVALID_TIMEZONE"
    SCHEDULE_NOT_FOUND = "SCHEDULE_NOT_FOUND"
    PRECONDITION_FAILED = "PRECONDITION_FAILED"
    # Execution outcomes recorded on attempts.
    EXECUTOR_START_FAILED = "EXECUTOR_START_FAILED"
    # Nothing was spawned because the worker was not there (docs/backlog-requeue.md).
    EXECUTOR_UNAVAILABLE = "EXECUTOR_UNAVAILABLE"
    # Recorded by older builds only: a low disk now keeps the run queued until space returns.
    DISK_ADMISSION_REFUSED = "DISK_ADMISSION_REFUSED"
    POST_SPAWN_PERSIST_FAILED = "POST_SPAWN_PERSIST_FAILED"
    RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT = "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT"
    RECOVERY_START_NOT_SPAWNED = "RECOVERY_START_NOT_SPAWNED"
    RECOVERY_START_INTERRUPTED = "RECOVERY_START_INTERRUPTED"
    RECOVERY_IDENTITY_UNSUPPORTED = "RECOVERY_IDENTITY_UNSUPPORTED"
    # The worker lease (docs/worker-lease.md).
    WORKER_LEASE_HELD = "WORKER_LEASE_HELD"
    WORKER_LEASE_LOST = "WORKER_LEASE_LOST"
    # Several hosts (docs/several-hosts.md): a vanished host's attempts, a fenced completion,
    # a log read whose host does not answer.
    WORKER_LEASE_EXPIRED = "WORKER_LEASE_EXPIRED"
    # An operator retired a stopped host (``qinglong lease retire``): its attempts still
    # active ended lost, never retried (their processes may live on that host).
    WORKER_RETIRED = "WORKER_RETIRED"
    LEASE_EPOCH_SUPERSEDED = "LEASE_EPOCH_SUPERSEDED"
    LOG_HOST_UNAVAILABLE = "LOG_HOST_UNAVAILABLE"
    # The worker refuses a database that is not at the newest migration.
    NOT_MIGRATED = "NOT_MIGRATED"
    QUEUE_FULL = "QUEUE_FULL"
    # Retention removed the attempt's log (docs/retention.md §4).
    LOG_EXPIRED = "LOG_EXPIRED"
    # An ended attempt recorded log bytes, yet its file is not there: removed outside the
    # service (by hand, a restore without logs/). Not an empty log.
    LOG_MISSING = "LOG_MISSING"


class DomainError(Exception):
    """Base of every refusal the domain can make; ``code`` is stable, ``detail`` is safe to show."""

    def __init__(self, code: ErrorCode, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class ValidationFailed(DomainError):
    """Input broke one of the API's validation rules."""


class InvalidSchedule(ValidationFailed):
    """A schedule's cron, interval, bounds or policies are not valid (INVALID_SCHEDULE)."""

    def __init__(self, detail: str) -> None:
        super().__init__(ErrorCode.INVALID_SCHEDULE, detail)


class InvalidTimezone(ValidationFailed):
    """A schedule names a time zone the IANA database does not hold (INVALID_TIMEZONE)."""

    def __init__(self, detail: str) -> None:
        super().__init__(ErrorCode.INVALID_TIMEZONE, detail)


class VersionConflict(DomainError):
    """A compare-and-set lost: somebody else changed the run first."""

    def __init__(self, run_id: str) -> None:
        super().__init__(ErrorCode.VERSION_CONFLICT, "the run changed concurrently")
        self.run_id = run_id


class PreconditionFailed(DomainError):
    """An If-Match named a version that is no longer the stored one."""

    def __init__(self, detail: str = "If-Match does not match the current version") -> None:
        super().__init__(ErrorCode.PRECONDITION_FAILED, detail)


class NotFound(DomainError):
    """A referenced resource does not exist."""


class SecretsMissing(NotFound):
    """Secrets a recipe names are not stored. ``names``: which (names, never values), so a
    run that fails for them can say which one to set."""

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__(ErrorCode.SECRET_NOT_FOUND, f"secret {names[0]} does not exist")
        self.names = tuple(names)


class Gone(DomainError):
    """The resource existed and retention removed it (docs/retention.md §4)."""


class Conflict(DomainError):
    """A write contradicts what is already stored."""


class InvalidTransition(Conflict):
    """A state change refused, by the state machine or by a rule the repository checks.

    ``reason`` replaces the generic detail when the states alone would allow the move (a
    cancel intent, an attempt already armed).
    """

    def __init__(self, kind: str, current: str, target: str, *, reason: str | None = None) -> None:
        super().__init__(
            ErrorCode.INVALID_TRANSITION, reason or f"{kind} cannot move from {current} to {target}"
        )
        self.kind = kind
        self.current = current
        self.target = target


class NotMigrated(DomainError):
    """The database is not at the newest migration: the worker never migrates. ``newer``:
    the database is at a migration this build does not know (a newer build wrote it), where
    `qinglong migrate` cannot help; ``known``: this build's newest."""

    def __init__(self, *, newer: str | None = None, known: str | None = None) -> None:
        if newer is None:
            detail = (
                "the database is not migrated to the newest schema; run `qinglong migrate` first"
            )
        else:
            detail = (
                f"the database is at migration {newer}, newer than this build knows (its "
                f"newest is {known}): run the build that migrated it or a newer one, or restore "
                "a backup made for this build (docs/operations.md §4)"
            )
        super().__init__(ErrorCode.NOT_MIGRATED, detail)
        self.newer = newer


class LeaseHeld(DomainError):
    """Another live worker holds the lease: this one must not start (one line to print)."""

    def __init__(self, holder: Lease, *, single_host: bool = False) -> None:
        # ``single_host``: the one lease of a SQLite database, refused to another instance.
        note = ""
        if single_host:
            note = (
                "; SQLite runs one worker per database: several hosts need PostgreSQL "
                "(docs/several-hosts.md)"
            )
        super().__init__(
            ErrorCode.WORKER_LEASE_HELD,
            f"the worker lease on this database is held by instance {holder.instance_id} on "
            f"host {holder.host} (pid {holder.pid}, epoch {holder.epoch}) since "
            f"{utc_instant(holder.acquired_at_ms)}, expiring {utc_instant(holder.expires_at_ms)} "
            "unless renewed; to take over, stop that worker (an orderly stop releases the lease), "
            f"or, if its host is gone, start this one again after the expiry{note}",
        )
        self.holder = holder


class LeaseLost(DomainError):
    """This worker no longer holds the lease: it stops serving (fail closed)."""

    def __init__(self, *, epoch: int, holder: Lease | None, instance_id: str = "") -> None:
        if holder is None or holder.epoch == epoch:
            taken = "could not be renewed before it expired"
        elif holder.instance_id == instance_id:
            taken = (
                f"expired and was superseded (epoch {holder.epoch}) by a worker of another "
                "host, which ended this host's active attempts"
            )
        else:
            taken = (
                f"was taken over by instance {holder.instance_id} on host {holder.host} "
                f"(epoch {holder.epoch})"
            )
        super().__init__(
            ErrorCode.WORKER_LEASE_LOST,
            f"the worker lease (epoch {epoch}) {taken}; this worker stops serving",
        )
        self.epoch = epoch
        self.holder = holder


class LogHostUnavailable(DomainError):
    """The attempt ran on another host, which did not answer the log read (or named no
    address to ask): docs/several-hosts.md §5."""

    def __init__(self, host: str | None) -> None:
        where = f"host {host}" if host else "another host"
        super().__init__(
            ErrorCode.LOG_HOST_UNAVAILABLE,
            f"this attempt ran on {where}, whose api does not answer; its log is kept there",
        )


class StorageUnavailable(Exception):
    """The database cannot commit now (disk full, read-only file system, I/O error).

    Not a DomainError: nothing is wrong with the request and nothing was refused, so code
    that treats a refusal as "it moved on meanwhile" must not swallow it. The api answers
    503 with its code and Retry-After; the worker's passes retry it like any outage. Its
    two subclasses are the other ways a database can fail a request for a while: the
    connection (DatabaseUnreachable) and SQLite's write lock (DatabaseBusy).
    """

    code = ErrorCode.STORAGE_UNAVAILABLE
    detail = "the database cannot store writes now (disk full or read-only); retry later"

    def __init__(self) -> None:
        super().__init__(f"{self.code}: {self.detail}")


class DatabaseUnreachable(StorageUnavailable):
    """The connection to the database was lost mid-transaction (a server restart, a cut
    network, the server ending an idle session) or could not be opened (refused, timed out,
    the server starting up). A read had no effect; a write cut off before its COMMIT was
    rolled back by the server, one cut off during it may have been kept (a retried enqueue
    takes its Idempotency-Key). The pool drops the dead connections; the next transaction
    connects afresh.
    """

    code = ErrorCode.DATABASE_UNREACHABLE
    detail = (
        "the database did not answer (connection lost or refused); retry later; a write cut "
        "off at its commit may have been kept"
    )


class DatabaseBusy(StorageUnavailable):
    """The database did not take the work in time: on SQLite another process held the write
    lock past the busy timeout (one frozen mid-transaction, a long ``sqlite3`` shell
    session); on either engine every pooled connection of this process stayed in use for
    the pool timeout (a stalled server, a lock held long). Nothing of the work was made."""

    code = ErrorCode.DATABASE_BUSY
    detail = (
        "the database did not take the request in time (its write lock or every connection "
        "stayed busy); nothing was written; retry later"
    )


class QueueFull(DomainError):
    """QL_MAX_QUEUED runs are queued already; the api answers 429 with Retry-After."""

    retry_after_s = 5

    def __init__(self, max_queued: int) -> None:
        super().__init__(
            ErrorCode.QUEUE_FULL,
            ("1 run is" if max_queued == 1 else f"{max_queued} runs are")
            + " queued already (QL_MAX_QUEUED); retry later",
        )
        self.max_queued = max_queued


class AdmissionRefused(Exception):
    """A concurrency budget is used up (docs/concurrency-budgets.md §2): the run stays queued.

    Not a DomainError: nothing was refused for good and nothing reaches a client. ``scope``
    is ``global`` (QL_MAX_RUNNING: the pass stops) or ``task`` (the revision's
    ``max_concurrent``: the pass goes on with the rest of its page) or ``held`` (a schedule's
    run still waiting behind an older run of its schedule: the pass goes on as well) or
    ``disk`` (the data dir's free space minus the reserve does not cover a log's quota: the
    pass stops, and the next tick tries again).
    """

    def __init__(self, scope: str) -> None:
        super().__init__(f"admission refused: {scope} budget used up")
        self.scope = scope


class KeyUnavailable(Exception):
    """The key a ciphertext names is not in the ring, or the row does not decrypt under it.

    Not a refusal of the request: the operator's key ring is incomplete (or a row was
    altered), so every run that needs the secret meets it too (the dispatcher stops its pass).
    """


class LaunchFailed(Exception):
    """The launch ended before a durable handle existed; nothing is left running."""

    def __init__(self, reason: str, errno_name: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason  # a stable, content-free reason such as "EXEC_FAILED"
        # The symbolic errno behind it, when a system call failed ("ENOENT", "EACCES"): it
        # tells a program that is not there from one that may not run. Never a path.
        self.errno_name = errno_name


class LaunchRejected(LaunchFailed):
    """The worker refused a launch of an attempt it already journaled (or fenced)."""


class LaunchUnavailable(LaunchFailed):
    """Provably nothing was spawned: the worker was not reached before the request was sent,
    or it refused the launch before journaling it (e.g. ``WORKER_SHUTTING_DOWN``)."""


class WorkerUnavailable(LaunchUnavailable):
    """The worker could not be reached or refused to serve; for ``launch``: provably before
    anything was journaled (never sent, or refused), so nothing spawned."""


class LaunchOutcomeUnknown(Exception):
    """The launch request may have reached the worker but no answer came back.

    Deliberately not a LaunchFailed: a process may exist, so the caller must not record an
    ending; recovery decides from the worker's journal (docs/design.md §3.8, fail closed).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason  # WORKER_NO_ANSWER, BAD_RESPONSE or the worker's INTERNAL


class ReceiptInvalid(ValueError):
    """A receipt that must be quarantined. ``reason`` is a stable code; no content inside."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}" if detail else reason)
