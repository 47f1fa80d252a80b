"""Every allowed transition is accepted and every other one refused, for runs and attempts."""

from __future__ import annotations

import itertools

import pytest

from app.domain.errors import InvalidTransition
from app.domain.states import (
    ATTEMPT_TRANSITIONS,
    RUN_TRANSITIONS,
    TERMINAL_ATTEMPT,
    TERMINAL_RUN,
    AttemptStatus,
    RunStatus,
    ending_for,
    transition_attempt,
    transition_run,
)

ALLOWED_RUN = {
    ("queued", "dispatching"), ("queued", "cancelled"), ("queued", "failed"),
    ("dispatching", "running"), ("dispatching", "queued"),
    *(("dispatching", t) for t in ("succeeded", "failed", "cancelled", "timed_out", "lost")),
    *(("running", t) for t in ("succeeded", "failed", "cancelled", "timed_out", "lost")),
}  # fmt: skip
ALLOWED_ATTEMPT = {
    ("claimed", "starting"), ("claimed", "cancelled"), ("claimed", "failed"),
    ("starting", "running"),
    *(("starting", t) for t in ("succeeded", "failed", "cancelled", "timed_out", "lost")),
    *(("running", t) for t in ("succeeded", "failed", "cancelled", "timed_out", "lost")),
}  # fmt: skip


@pytest.mark.parametrize(("current", "target"), list(itertools.product(RunStatus, RunStatus)))
def test_run_transition_is_allowed_exactly_when_the_design_says(
    current: RunStatus, target: RunStatus
) -> None:
    if (current.value, target.value) in ALLOWED_RUN:
        assert transition_run(current, target) is target
    else:
        with pytest.raises(InvalidTransition) as info:
            transition_run(current, target)
        assert info.value.code == "INVALID_TRANSITION"
        assert (info.value.current, info.value.target) == (current, target)


@pytest.mark.parametrize(
    ("current", "target"), list(itertools.product(AttemptStatus, AttemptStatus))
)
def test_attempt_transition_is_allowed_exactly_when_the_design_says(
    current: AttemptStatus, target: AttemptStatus
) -> None:
    if (current.value, target.value) in ALLOWED_ATTEMPT:
        assert transition_attempt(current, target) is target
    else:
        with pytest.raises(InvalidTransition):
            transition_attempt(current, target)


def test_terminal_states_have_no_way_out() -> None:
    for status in TERMINAL_RUN:
        assert status not in RUN_TRANSITIONS
    for status in TERMINAL_ATTEMPT:
        assert status not in ATTEMPT_TRANSITIONS


@pytest.mark.parametrize(
    ("exit_code", "signal", "reason", "expected"),
    [
        (0, None, None, "succeeded"),
        (3, None, None, "failed"),
        (137, 9, None, "failed"),
        (0, None, "user", "cancelled"),
        (0, None, "timeout", "timed_out"),
        (143, 15, "timeout", "timed_out"),
    ],
)
def test_a_committed_cancel_intent_decides_the_ending_whatever_the_exit_code(
    exit_code: int, signal: int | None, reason: str | None, expected: str
) -> None:
    assert ending_for(exit_code=exit_code, signal=signal, cancel_reason=reason) == expected
