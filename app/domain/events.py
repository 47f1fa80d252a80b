"""Run event type names: ``<subject>.<state>`` plus the intent events."""

from __future__ import annotations

from app.domain.states import AttemptStatus, RunStatus

RUN_CANCEL_REQUESTED = "run.cancel_requested"
# An attempt ended and the run went back to queued for the next one (docs/retries.md).
RUN_RETRY_SCHEDULED = "run.retry_scheduled"


def run_event(status: RunStatus) -> str:
    """Event type recorded when a run enters ``status``."""
    return f"run.{status.value}"


def attempt_event(status: AttemptStatus) -> str:
    """Event type recorded when an attempt enters ``status``."""
    return f"attempt.{status.value}"


ALL_EVENT_TYPES = frozenset(
    [run_event(s) for s in RunStatus]
    + [attempt_event(s) for s in AttemptStatus if s is not AttemptStatus.CLAIMED]
    + ["attempt.claimed", RUN_CANCEL_REQUESTED, RUN_RETRY_SCHEDULED]
)
