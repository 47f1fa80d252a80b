"""Retention of logs and run rows (docs/retention.md): the policy and the keep decision.

Pure: the storage layer reads a task's anchors (its newest ``keep_runs`` run ids, its latest
succeeded and latest failed run) and one bounded page of candidates, oldest first; these
functions decide which logs expire and which rows go. The same rules hold for every policy:

- never touched: a run that is not terminal, an attempt whose receipt is not consumed (or is
  quarantined and not yet past its own retention), a pinned run;
- kept by policy (the union): the newest ``keep_runs`` runs of the task, runs younger than
  ``keep_days`` (0 keeps nothing by age), the latest succeeded and the latest failed run;
- under byte pressure (the task's log bytes over its budget, the total over its budget, or
  free space below what a run needs to start, the reserve plus a log's quota) the oldest
  logs kept only by ``keep_runs`` or ``keep_days`` go too; the latest succeeded and failed
  run keep theirs;
- a run's rows (run, attempts, events) go only past ``keep_rows`` (the row budget, larger than
  ``keep_runs``), once none of its logs is left and nothing above keeps it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from app.domain.errors import ErrorCode, ValidationFailed

MIB = 1024 * 1024
DAY_MS = 86_400_000
MAX_KEEP_RUNS = 1_000_000
MAX_KEEP_DAYS = 36_500
MAX_BYTES = 2**62

# Why a run's log is kept. HARD reasons hold against every budget; SOFT ones yield to bytes.
ACTIVE = "active"
UNCONSUMED = "receipt_not_consumed"
PINNED = "pinned"
LATEST_SUCCEEDED = "latest_succeeded"
LATEST_FAILED = "latest_failed"
RECENT = "keep_runs"
YOUNG = "keep_days"
HARD = frozenset({ACTIVE, UNCONSUMED, PINNED})
FLOOR = frozenset({LATEST_SUCCEEDED, LATEST_FAILED})
SOFT = frozenset({RECENT, YOUNG})


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """What one task keeps. ``task_log_bytes`` None: no per-task byte budget."""

    keep_runs: int
    keep_days: int
    keep_rows: int
    task_log_bytes: int | None

    def validated(self, keep_runs_from: str = "") -> RetentionPolicy:
        """Self, or ValidationFailed naming the broken rule (``keep_runs_from``: where
        keep_runs came from, said beside it, as ", the global value")."""
        _bounded("keep_runs", self.keep_runs, 0, MAX_KEEP_RUNS)
        _bounded("keep_days", self.keep_days, 0, MAX_KEEP_DAYS)
        _bounded("keep_rows", self.keep_rows, 1, MAX_KEEP_RUNS * 10)
        if self.keep_rows <= self.keep_runs:
            raise ValidationFailed(
                ErrorCode.VALIDATION_FAILED,
                f"keep_rows ({self.keep_rows}) must be larger than keep_runs "
                f"({self.keep_runs}{keep_runs_from})",
            )
        if self.task_log_bytes is not None:
            _bounded("task_log_bytes", self.task_log_bytes, 0, MAX_BYTES)
        return self


@dataclass(frozen=True, slots=True)
class TaskOverride:
    """A task's own policy fields (None: the global setting's value)."""

    keep_runs: int | None = None
    keep_days: int | None = None
    keep_rows: int | None = None
    task_log_bytes: int | None = None

    def over(self, base: RetentionPolicy) -> RetentionPolicy:
        """The effective policy: these fields where set, ``base`` elsewhere (validated)."""
        policy = replace(
            base,
            keep_runs=base.keep_runs if self.keep_runs is None else self.keep_runs,
            keep_days=base.keep_days if self.keep_days is None else self.keep_days,
            keep_rows=base.keep_rows if self.keep_rows is None else self.keep_rows,
            task_log_bytes=base.task_log_bytes
            if self.task_log_bytes is None
            else self.task_log_bytes,
        )
        if self.keep_rows is None and policy.keep_rows <= policy.keep_runs:
            # A task that keeps more logs than the global row budget keeps its rows longer.
            policy = replace(policy, keep_rows=policy.keep_runs * 2 + 1)
        # The task's keep_rows against the global keep_runs: the refusal says where that is.
        return policy.validated(", the global value" if self.keep_runs is None else "")

    def in_force(self, base: RetentionPolicy) -> RetentionPolicy:
        """The policy the sweep applies and GET shows: ``over``, or, when ``base`` (the
        global settings) changed after this override was stored so that its ``keep_rows``
        no longer exceeds ``keep_runs``, the same with ``keep_rows`` derived as if unset
        (more rows kept, never fewer): a stored policy never fails a sweep pass."""
        try:
            return self.over(base)
        except ValidationFailed:
            return replace(self, keep_rows=None).over(base)


@dataclass(frozen=True, slots=True)
class GlobalBudgets:
    """Budgets over every task: total log bytes (None: none), and the free space to keep
    (the worker's sweep: what a run needs to start, reserve plus a log's quota; the api's
    storage report: the reserve)."""

    total_log_bytes: int | None
    free_reserve_bytes: int


@dataclass(frozen=True, slots=True)
class TaskAnchors:
    """What the keep set needs of a task beside the candidate itself (bounded reads)."""

    # The id of the keep_runs-th newest run (runs at or above it are recent); None when the
    # task has fewer runs (all recent) or keep_runs is 0 (none are).
    recent_from_id: str | None
    has_recent: bool
    latest_succeeded_id: str | None
    latest_failed_id: str | None


@dataclass(frozen=True, slots=True)
class Candidate:
    """One run as the sweep sees it (one row per attempt with a log)."""

    run_id: str
    attempt_id: str | None
    created_at_ms: int
    terminal: bool
    pinned: bool
    receipt_settled: bool  # no journal entry that still needs the attempt's files
    log_present: bool  # the attempt has a log that is not expired or expiring
    log_bytes: int


def keep_reasons(
    c: Candidate, anchors: TaskAnchors, policy: RetentionPolicy, now_ms: int
) -> frozenset[str]:
    """Every reason the run (and so its logs and rows) is kept; empty: it may go."""
    reasons: set[str] = set()
    if not c.terminal:
        reasons.add(ACTIVE)
    if not c.receipt_settled:
        reasons.add(UNCONSUMED)
    if c.pinned:
        reasons.add(PINNED)
    if c.run_id == anchors.latest_succeeded_id:
        reasons.add(LATEST_SUCCEEDED)
    if c.run_id == anchors.latest_failed_id:
        reasons.add(LATEST_FAILED)
    if anchors.has_recent and (
        anchors.recent_from_id is None or c.run_id >= anchors.recent_from_id
    ):
        reasons.add(RECENT)
    if policy.keep_days > 0 and c.created_at_ms > now_ms - policy.keep_days * DAY_MS:
        reasons.add(YOUNG)
    return frozenset(reasons)


@dataclass(frozen=True, slots=True)
class TaskPlan:
    """What one task's page decides: logs to expire (attempt ids) and runs to delete."""

    expire: list[str]
    freed_bytes: int


def plan_logs(
    candidates: Sequence[Candidate],
    anchors: TaskAnchors,
    policy: RetentionPolicy,
    now_ms: int,
    *,
    over_bytes: int = 0,
    limit: int,
) -> TaskPlan:
    """Logs to expire from ``candidates`` (oldest first), at most ``limit``.

    A log with no keep reason expires. While ``over_bytes`` (bytes past the task's or the
    global budget, or missing below the free-space target) is positive, the oldest logs kept
    only by a soft reason (keep_runs, keep_days) expire too, until it is covered.
    """
    expire: list[str] = []
    freed = 0
    for c in candidates:
        if len(expire) >= limit:
            break
        if not c.log_present or c.attempt_id is None:
            continue
        reasons = keep_reasons(c, anchors, policy, now_ms)
        if not reasons or (freed < over_bytes and reasons <= SOFT):
            expire.append(c.attempt_id)
            freed += c.log_bytes
    return TaskPlan(expire=expire, freed_bytes=freed)


def rows_deletable(
    c: Candidate, anchors: TaskAnchors, policy: RetentionPolicy, now_ms: int, *, past_rows: bool
) -> bool:
    """True when the run's rows may go: past the row budget, no log left, nothing keeps it.

    ``past_rows``: the run is older than the task's ``keep_rows``-th newest run.
    """
    if not past_rows or c.log_present:
        return False
    return not (keep_reasons(c, anchors, policy, now_ms) - SOFT)


def _bounded(name: str, value: int, least: int, most: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise ValidationFailed(
            ErrorCode.VALIDATION_FAILED, f"{name} must be a whole number {least}..{most}"
        )
