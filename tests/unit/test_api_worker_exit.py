"""What uvicorn's manager does about an api worker that exited (app/api/startup.py
``after_exit``): only an api none of whose workers ever served ends; one lost worker is not an
outage, and a worker that never serves is not restarted every half second forever."""

from __future__ import annotations

import signal

import pytest

from app.api.startup import (
    EXIT_CANNOT_START,
    RETRY_FIRST_S,
    RETRY_MAX_S,
    Backoffs,
    after_exit,
    exit_line,
)

KILLED = -signal.SIGKILL


@pytest.mark.parametrize("code", [EXIT_CANNOT_START, KILLED, 0, 1])
def test_a_worker_that_served_is_started_again_at_once(code: int) -> None:
    assert after_exit(code, was_ready=True, api_served=True) == "restart"


@pytest.mark.parametrize("code", [EXIT_CANNOT_START, KILLED])
def test_before_any_worker_served_one_that_cannot_start_or_dies_by_a_signal_ends_the_api(
    code: int,
) -> None:
    assert after_exit(code, was_ready=False, api_served=False) == "end"


@pytest.mark.parametrize("code", [EXIT_CANNOT_START, KILLED, 1])
def test_once_the_api_served_a_replacement_that_cannot_start_is_retried_after_a_backoff(
    code: int,
) -> None:
    assert after_exit(code, was_ready=False, api_served=True) == "retry"


def test_an_other_exit_before_serving_is_retried_not_looped() -> None:
    assert after_exit(1, was_ready=False, api_served=False) == "retry"


def test_the_line_of_a_worker_that_said_nothing() -> None:
    assert exit_line(KILLED) == "an api worker exited by signal 9 before serving"
    assert exit_line(EXIT_CANNOT_START) == "an api worker could not start (exit status 3)"


def test_a_worker_that_did_not_answer_the_ping_is_never_the_end_by_itself() -> None:
    # The manager killed it (no answer in time): code None, not "died by signal 9".
    assert after_exit(None, was_ready=False, api_served=False) == "retry"
    assert after_exit(None, was_ready=True, api_served=True) == "restart"


def test_each_slot_backs_off_on_its_own() -> None:
    # Slot 1's workers never start; slot 0's worker is killed and its replacement serves:
    # that does not cut slot 1's wait short (one backoff for all slots did).
    backoffs = Backoffs()
    assert [backoffs.next(1) for _ in range(2)] == [RETRY_FIRST_S, 2 * RETRY_FIRST_S]
    backoffs.next(0)
    backoffs.reset(0)
    assert backoffs.next(1) == 4 * RETRY_FIRST_S
    assert backoffs.next(0) == RETRY_FIRST_S
    for _ in range(20):
        last = backoffs.next(1)
    assert last == RETRY_MAX_S
