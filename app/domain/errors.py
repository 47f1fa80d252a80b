"""Stable error codes and the typed domain errors that carry them."""

from __future__ import annotations

from enum import StrEnum


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
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
    REVISION_CONFLICT = "REVISION_CONFLICT"
    RECIPE_CONFLICT = "RECIPE_CONFLICT"
    RECIPE_NOT_FOUND = "RECIPE_NOT_FOUND"
    TASK_NOT_FOUND = "TASK_NOT_FOUND"
    REVISION_NOT_FOUND = "REVISION_NOT_FOUND"
    RUN_NOT_FOUND = "RUN_NOT_FOUND"
    ATTEMPT_NOT_FOUND = "ATTEMPT_NOT_FOUND"
    SECRET_NOT_FOUND = "SECRET_NOT_FOUND"
    RUN_TERMINAL = "RUN_TERMINAL"
    IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
    INVALID_TRANSITION = "INVALID_TRANSITION"
    VERSION_CONFLICT = "VERSION_CONFLICT"
    INVALID_CURSOR = "INVALID_CURSOR"
    STORAGE_UNAVAILABLE = "STORAGE_UNAVAILABLE"
    # Execution outcomes recorded on attempts.
    EXECUTOR_START_FAILED = "EXECUTOR_START_FAILED"
    # Nothing was spawned because the worker was not there (docs/backlog-requeue.md).
    EXECUTOR_UNAVAILABLE = "EXECUTOR_UNAVAILABLE"
    DISK_ADMISSION_REFUSED = "DISK_ADMISSION_REFUSED"
    POST_SPAWN_PERSIST_FAILED = "POST_SPAWN_PERSIST_FAILED"
    RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT = "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT"
    RECOVERY_START_NOT_SPAWNED = "RECOVERY_START_NOT_SPAWNED"
    RECOVERY_START_INTERRUPTED = "RECOVERY_START_INTERRUPTED"
    RECOVERY_IDENTITY_UNSUPPORTED = "RECOVERY_IDENTITY_UNSUPPORTED"
    # The worker lease (docs/worker-lease.md).
    WORKER_LEASE_HELD = "WORKER_LEASE_HELD"
    WORKER_LEASE_LOST = "WORKER_LEASE_LOST"


class DomainError(Exception):
    """Base of every refusal the domain can make; ``code`` is stable, ``detail`` is safe to show."""

    def __init__(self, code: ErrorCode, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class ValidationFailed(DomainError):
    """Input broke one of the API's validation rules."""


class InvalidTransition(DomainError):
    """A state change the state machine does not allow."""

    def __init__(self, kind: str, current: str, target: str) -> None:
        super().__init__(
            ErrorCode.INVALID_TRANSITION, f"{kind} cannot move from {current} to {target}"
        )
        self.kind = kind
        self.current = current
        self.target = target


class VersionConflict(DomainError):
    """A compare-and-set lost: somebody else changed the run first."""

    def __init__(self, run_id: str) -> None:
        super().__init__(ErrorCode.VERSION_CONFLICT, "the run changed concurrently")
        self.run_id = run_id


class NotFound(DomainError):
    """A referenced resource does not exist."""


class Conflict(DomainError):
    """A write contradicts what is already stored."""


class StorageUnavailable(Exception):
    """The database cannot commit now (disk full, read-only file system, I/O error).

    Not a DomainError: nothing is wrong with the request and nothing was refused, so code
    that treats a refusal as "it moved on meanwhile" must not swallow it. The api answers
    503 STORAGE_UNAVAILABLE with Retry-After; the worker's passes retry it like any outage.
    """

    code = ErrorCode.STORAGE_UNAVAILABLE
    detail = "the database cannot store writes now (disk full or read-only); retry later"

    def __init__(self) -> None:
        super().__init__(f"{self.code}: {self.detail}")
