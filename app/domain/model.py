"""Value objects the layers pass between them (plain frozen dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from app.domain.execution import Leftovers
from app.domain.retry import RetryPolicy

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TaskRevision:
    """One immutable, numbered definition of what a task executes."""

    task: str
    revision: int
    executor: str
    argv: tuple[str, ...]
    cwd: str | None
    recipe: str | None
    timeout_seconds: int | None
    priority: int
    digest: str
    created_at_ms: int
    leftovers: Leftovers = "kill"  # what happens to the rest of the job when its main process ends
    run_as: str | None = None  # a job user from QL_JOB_USERS (docs/job-user.md)
    # Runs of this task admitted at once (docs/concurrency-budgets.md §2); None: unlimited.
    max_concurrent: int | None = None
    # Failed attempts followed by new ones (docs/retries.md); None: none (max_attempts 1).
    retry: RetryPolicy | None = None

    def body(self) -> dict[str, Any]:
        """The canonical body whose digest identifies this revision."""
        return revision_body(
            executor=self.executor,
            argv=list(self.argv),
            cwd=self.cwd,
            recipe=self.recipe,
            timeout_seconds=self.timeout_seconds,
            priority=self.priority,
            leftovers=self.leftovers,
            run_as=self.run_as,
            max_concurrent=self.max_concurrent,
            retry=self.retry,
        )


def revision_body(
    *,
    executor: str,
    argv: list[str],
    cwd: str | None,
    recipe: str | None,
    timeout_seconds: int | None,
    priority: int,
    leftovers: str = "kill",
    run_as: str | None = None,
    max_concurrent: int | None = None,
    retry: RetryPolicy | None = None,
) -> dict[str, Any]:
    """The dict that is canonicalized and digested for a revision.

    ``leftovers`` enters the body only when it is not the default: a revision stored before
    the field existed keeps its digest, and re-putting it unchanged is still "the same".
    ``run_as``, ``max_concurrent`` and ``retry`` likewise enter only when set.
    """
    body: dict[str, Any] = {
        "executor": executor,
        "argv": argv,
        "cwd": cwd,
        "recipe": recipe,
        "timeout_seconds": timeout_seconds,
        "priority": priority,
    }
    if leftovers != "kill":
        body["leftovers"] = leftovers
    if run_as is not None:
        body["run_as"] = run_as
    if max_concurrent is not None:
        body["max_concurrent"] = max_concurrent
    if retry is not None:
        body["retry"] = retry.body()
    return body


# Which tasks ``GET /api/v1/tasks`` lists: not archived (the default), every one, or archived.
ArchivedFilter = Literal["exclude", "include", "only"]


@dataclass(frozen=True, slots=True)
class TaskSummary:
    """A task in a list: its latest revision number and whether it is archived
    (``archived_at_ms``: when, None when it is not; docs/api.md §4)."""

    task: str
    latest_revision: int
    archived_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class SecretName:
    """What may be shown about a secret: its name and when it last changed (never a value)."""

    name: str
    updated_at_ms: int


@dataclass(frozen=True, slots=True)
class Recipe:
    """A content-addressed environment: plain values and secret references."""

    id: str
    env: dict[str, str]
    secrets: dict[str, str]
    created_at_ms: int


@dataclass(frozen=True, slots=True)
class CancelIntent:
    """A committed request to stop a run, by a user or by its deadline."""

    reason: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class LogInfo:
    """What is known of an attempt's log artifact."""

    bytes: int
    truncated: bool
    dropped_bytes: int
    # Why bytes were dropped (TRUNCATION_REASONS), once the shim's fact says so.
    reason: str | None = None
    # The log's offset where the dropped bytes were cut out: the bytes after it are the
    # output's end (equal to ``bytes`` when nothing followed). None when not recorded.
    dropped_at: int | None = None
    # Retention removed the file (docs/retention.md §4): bytes are what it had.
    expired: bool = False
    expired_at_ms: int | None = None


# The shim's truncation fact (api-schemas/launch-protocol.md §3 step 9).
TRUNCATION_REASONS = frozenset({"quota", "disk_full", "write_error"})


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try at executing a run."""

    id: str
    run_id: str
    number: int
    status: str
    executor: str
    created_at_ms: int
    started_at_ms: int | None
    finished_at_ms: int | None
    exit_code: int | None
    signal: int | None
    error_code: str | None
    deadline_at_ms: int | None
    log_artifact_id: str | None
    callback_sequence: int
    log: LogInfo | None = None
    # The worker instance that launched it (docs/several-hosts.md); never exposed by the API.
    worker_instance_id: str | None = None
    # A retry's attempt may not start before this instant (docs/retries.md); None: at once.
    not_before_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Waiting:
    """Why a queued run has not started (docs/concurrency-budgets.md §2): ``max_running``
    (that many runs are active), ``max_concurrent`` (its task's limit is reached) or
    ``held`` (an older run of its schedule has not ended); ``limit`` and ``active`` for the
    two budgets."""

    reason: str
    limit: int | None = None
    active: int | None = None


@dataclass(frozen=True, slots=True)
class Run:
    """A request to execute one task revision, and what became of it."""

    id: str
    task: str
    revision: int
    status: str
    priority: int
    version: int
    created_at_ms: int
    started_at_ms: int | None
    finished_at_ms: int | None
    cancel: CancelIntent | None
    latest_attempt: Attempt | None = None
    # What started it (docs/schedules.md): "manual", or "schedule" with its name and slot.
    trigger_kind: str = "manual"
    schedule: str | None = None
    slot_ms: int | None = None
    # Kept against every retention policy (docs/retention.md §2).
    pinned: bool = False
    # A rerun (POST /runs/{id}/rerun) names the run it repeats (docs/retries.md §5).
    rerun_of: str | None = None

    @property
    def attempts(self) -> int:
        """How many attempts the run has had (its latest attempt's number)."""
        return self.latest_attempt.number if self.latest_attempt is not None else 0

    @property
    def next_attempt_at_ms(self) -> int | None:
        """When a retry waiting in the queue may start; None when none waits."""
        latest = self.latest_attempt
        if latest is None or latest.status != "claimed":
            return None
        return latest.not_before_ms

    def retry_waits(self, at_ms: int) -> bool:
        """Whether a retry waits in the queue for its time, still to come at ``at_ms``."""
        retry_at = self.next_attempt_at_ms
        return retry_at is not None and retry_at > at_ms


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One append-only fact in a run's history."""

    run_id: str
    seq: int
    type: str
    at_ms: int
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One keyset page: items plus the opaque cursor of the next page, if any."""

    items: list[T]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class ProcessHandle:
    """Durable identity of a launched job (and of the shim that parents it)."""

    boot_id: str
    pid: int
    pgid: int
    start_ticks: int
    shim_pid: int
    shim_start_ticks: int
    # The job's own cgroup, ``ql-<attempt id>`` under the worker's cgroup root, when the
    # shim could give it one (docs/leftovers.md); the stop re-derives and checks the path.
    cgroup: str | None = None

    def is_stoppable(self) -> bool:
        """Exact-identity stop can act on it: a boot id, positive ids, a job leading its group."""
        numbers = (self.pid, self.pgid, self.start_ticks, self.shim_pid, self.shim_start_ticks)
        return (
            bool(self.boot_id)
            and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in numbers)
            and self.pid == self.pgid
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for storage and the worker protocol (``cgroup`` only when there is one,
        so a handle stored before cgroups existed reads back the same)."""
        data: dict[str, Any] = {
            "boot_id": self.boot_id,
            "pid": self.pid,
            "pgid": self.pgid,
            "start_ticks": self.start_ticks,
            "shim_pid": self.shim_pid,
            "shim_start_ticks": self.shim_start_ticks,
        }
        if self.cgroup is not None:
            data["cgroup"] = self.cgroup
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessHandle:
        """Rebuild a handle; raise ValueError if a field is missing or not of its type."""
        try:
            values = {
                "boot_id": str(data["boot_id"]),
                **{
                    k: data[k]
                    for k in ("pid", "pgid", "start_ticks", "shim_pid", "shim_start_ticks")
                },
            }
        except (KeyError, TypeError) as exc:
            raise ValueError("incomplete process handle") from exc
        for key, value in values.items():
            if key != "boot_id" and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"handle field {key} must be an integer")
        cgroup = data.get("cgroup")
        if cgroup is not None and not isinstance(cgroup, str):
            raise ValueError("handle field cgroup must be a string")
        return cls(**values, cgroup=cgroup)


def plausible_handle(handle: object) -> bool:
    """A handle exact-identity stop can act on: a ``ProcessHandle`` that ``is_stoppable``."""
    return isinstance(handle, ProcessHandle) and handle.is_stoppable()


OVERLAP_POLICIES = ("skip", "allow", "queue_one", "replace")  # docs/schedules.md §5
CATCHUP_POLICIES = ("latest", "all", "none")


@dataclass(frozen=True, slots=True)
class ScheduleDefinition:
    """What a schedule's PUT body says (docs/schedules.md §1); ``paused`` is kept apart."""

    task: str
    revision: int | None
    cron: tuple[str, ...] | None
    every_seconds: int | None
    timezone: str = "UTC"
    overlap: str = "skip"
    max_concurrent: int = 1
    catchup: str = "latest"
    catchup_window_seconds: int = 3600
    jitter_seconds: int = 0
    dst_gap: str = "shift"
    dst_fold: str = "first"
    start_at_ms: int | None = None
    end_at_ms: int | None = None

    def body(self) -> dict[str, object]:
        """The stored form: every field, cron as a list."""
        return {
            "task": self.task,
            "revision": self.revision,
            "cron": list(self.cron) if self.cron is not None else None,
            "every_seconds": self.every_seconds,
            "timezone": self.timezone,
            "overlap": self.overlap,
            "max_concurrent": self.max_concurrent,
            "catchup": self.catchup,
            "catchup_window_seconds": self.catchup_window_seconds,
            "jitter_seconds": self.jitter_seconds,
            "dst_gap": self.dst_gap,
            "dst_fold": self.dst_fold,
            "start_at_ms": self.start_at_ms,
            "end_at_ms": self.end_at_ms,
        }

    @classmethod
    def from_body(cls, body: dict[str, object]) -> ScheduleDefinition:
        """The definition of a stored body."""
        cron = body.get("cron")
        values = dict(body)
        values["cron"] = tuple(cron) if isinstance(cron, list) else None
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Schedule:
    """A stored schedule and where its durable cursor stands."""

    id: str
    name: str
    definition: ScheduleDefinition
    paused: bool
    version: int
    cursor_ms: int
    next_due_ms: int | None
    created_at_ms: int
    updated_at_ms: int

    @property
    def etag(self) -> str:
        """Strong ETag: the id and version, so a re-created schedule never matches an old one."""
        return f'"{self.id}.{self.version}"'


@dataclass(frozen=True, slots=True)
class ScheduleDecision:
    """What became of one slot (or, for ``missed``, of ``count`` slots up to until_slot_ms)."""

    slot_ms: int
    decision: str
    run_id: str | None
    count: int
    until_slot_ms: int | None
    at_ms: int
