"""Run and attempt state machines (docs/design.md §3.1)."""

from __future__ import annotations

from enum import StrEnum

from app.domain.errors import InvalidTransition


class RunStatus(StrEnum):
    """States of a run; only the system changes them."""

    QUEUED = "queued"
    DISPATCHING = "dispatching"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    LOST = "lost"


class AttemptStatus(StrEnum):
    """States of one attempt at executing a run."""

    CLAIMED = "claimed"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    LOST = "lost"


TERMINAL_RUN = frozenset(
    {
        RunStatus.SUCCEEDED,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
        RunStatus.TIMED_OUT,
        RunStatus.LOST,
    }
)
TERMINAL_ATTEMPT = frozenset(
    {
        AttemptStatus.SUCCEEDED,
        AttemptStatus.FAILED,
        AttemptStatus.CANCELLED,
        AttemptStatus.TIMED_OUT,
        AttemptStatus.LOST,
    }
)
ACTIVE_ATTEMPT = frozenset({AttemptStatus.STARTING, AttemptStatus.RUNNING})

_RUN_ENDINGS = frozenset(TERMINAL_RUN)
_ATTEMPT_ENDINGS = frozenset(TERMINAL_ATTEMPT)

RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    # A queued run may be cancelled at once, or failed before launch (missing secret, bad env).
    RunStatus.QUEUED: frozenset({RunStatus.DISPATCHING, RunStatus.CANCELLED, RunStatus.FAILED}),
    # Back to queued only when the start provably spawned nothing (the executor was not
    # there): the attempt ends and a fresh claimed one is created in the same step.
    RunStatus.DISPATCHING: frozenset({RunStatus.RUNNING, RunStatus.QUEUED}) | _RUN_ENDINGS,
    RunStatus.RUNNING: _RUN_ENDINGS,
}
ATTEMPT_TRANSITIONS: dict[AttemptStatus, frozenset[AttemptStatus]] = {
    AttemptStatus.CLAIMED: frozenset(
        {AttemptStatus.STARTING, AttemptStatus.CANCELLED, AttemptStatus.FAILED}
    ),
    AttemptStatus.STARTING: frozenset({AttemptStatus.RUNNING}) | _ATTEMPT_ENDINGS,
    AttemptStatus.RUNNING: _ATTEMPT_ENDINGS,
}


# A run whose starts keep finding no executor gets a fresh attempt this many times in a row
# at most; the next such start ends it failed EXECUTOR_UNAVAILABLE (docs/backlog-requeue.md:
# a worker that dies on this very launch must not be crashed forever).
MAX_UNAVAILABLE_ATTEMPTS = 5


# A run goes back to ``queued`` for a retry (docs/retries.md) from wherever its attempt can
# end: queued (failed before start), dispatching (a start failure) or running.
RETRY_FROM = frozenset({RunStatus.QUEUED, RunStatus.DISPATCHING, RunStatus.RUNNING})


def transition_run_to_retry(current: RunStatus) -> RunStatus:
    """``queued`` if a run in ``current`` may wait for its next attempt; else InvalidTransition."""
    if current not in RETRY_FROM:
        raise InvalidTransition("run", current, RunStatus.QUEUED)
    return RunStatus.QUEUED


def is_terminal_run(status: str) -> bool:
    """True when a run in ``status`` can never change again."""
    return status in TERMINAL_RUN


def transition_run(current: RunStatus, target: RunStatus) -> RunStatus:
    """Return ``target`` if a run may move there from ``current``; raise InvalidTransition."""
    if target not in RUN_TRANSITIONS.get(current, frozenset()):
        raise InvalidTransition("run", current, target)
    return target


def transition_attempt(current: AttemptStatus, target: AttemptStatus) -> AttemptStatus:
    """Return ``target`` if an attempt may move there from ``current``; raise InvalidTransition."""
    if target not in ATTEMPT_TRANSITIONS.get(current, frozenset()):
        raise InvalidTransition("attempt", current, target)
    return target


def ending_for(
    *, exit_code: int | None, signal: int | None, cancel_reason: str | None
) -> AttemptStatus:
    """Map a process ending to a terminal state; a committed cancel intent always wins."""
    if cancel_reason == "timeout":
        return AttemptStatus.TIMED_OUT
    if cancel_reason is not None:
        return AttemptStatus.CANCELLED
    if signal is None and exit_code == 0:
        return AttemptStatus.SUCCEEDED
    return AttemptStatus.FAILED
