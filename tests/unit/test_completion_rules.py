"""The completion rules (app/domain/completion_rules.py), pure: which process ending may
become an attempt's terminal state, from the rows the completion transaction read.

tests/storage/test_transitions.py, test_state_machine.py and the recovery tests check the
same rules through the real transaction on both engines; these check every combination fast.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.canonical import sha256_digest
from app.domain.completion_rules import (
    LOCAL_PROCESS,
    NOT_LATEST_ATTEMPT,
    WRONG_ATTEMPT,
    WRONG_EXECUTOR,
    WRONG_SEQUENCE,
    WRONG_TOKEN,
    Accepted,
    AlreadyEnded,
    Refused,
    decide_completion,
    refuse_caller,
)
from app.domain.states import TERMINAL_ATTEMPT, TERMINAL_RUN, AttemptStatus, RunStatus

TOKEN = "qlcb_right-token"
CREATED = 1_000_000


@dataclass(frozen=True)
class Attempt:
    run_id: str = "run-1"
    number: int = 1
    status: str = AttemptStatus.RUNNING
    executor: str = LOCAL_PROCESS
    callback_token_digest: str | None = sha256_digest(TOKEN.encode())
    callback_sequence: int = 0
    created_at_ms: int = CREATED
    started_at_ms: int | None = CREATED + 10


@dataclass(frozen=True)
class RunRow:
    status: str = RunStatus.RUNNING
    latest_attempt: int = 1
    cancel_reason: str | None = None


def decide(
    attempt: Attempt | None = None,
    run: RunRow | None = None,
    *,
    sequence: int = 1,
    exit_code: int = 0,
    signal: int | None = None,
    finished: int = CREATED + 500,
    started: int | None = None,
) -> object:
    return decide_completion(
        attempt or Attempt(), run or RunRow(), callback_sequence=sequence, exit_code=exit_code, signal=signal,
        finished_at_ms=finished, started_at_ms=started,
    )  # fmt: skip


# -- rule 1: the caller ---------------------------------------------------------------------


def test_the_right_token_for_the_runs_own_attempt_is_let_through() -> None:
    assert refuse_caller(Attempt(), run_id="run-1", token=TOKEN) is None


@pytest.mark.parametrize(
    ("attempt", "run_id", "token", "reason"),
    [
        (None, "run-1", TOKEN, WRONG_ATTEMPT),
        (Attempt(), "run-2", TOKEN, WRONG_ATTEMPT),
        (Attempt(executor="ssh"), "run-1", TOKEN, WRONG_EXECUTOR),
        (Attempt(callback_token_digest=None), "run-1", TOKEN, WRONG_TOKEN),  # never armed
        (Attempt(), "run-1", TOKEN + "x", WRONG_TOKEN),
        (Attempt(), "run-1", "", WRONG_TOKEN),
    ],
)
def test_a_caller_that_is_not_the_attempts_own_is_refused_with_a_stable_reason(
    attempt: Attempt | None, run_id: str, token: str, reason: str
) -> None:
    assert refuse_caller(attempt, run_id=run_id, token=token) == Refused(reason)


def test_the_attempt_is_checked_before_the_executor_and_the_executor_before_the_token() -> None:
    foreign = Attempt(run_id="run-2", executor="ssh", callback_token_digest=None)
    assert refuse_caller(foreign, run_id="run-1", token="") == Refused(WRONG_ATTEMPT)
    assert refuse_caller(replace(foreign, run_id="run-1"), run_id="run-1", token="") == Refused(
        WRONG_EXECUTOR
    )


@given(st.text(max_size=40), st.text(max_size=40))
def test_only_the_token_whose_digest_was_committed_passes(armed: str, offered: str) -> None:
    attempt = Attempt(callback_token_digest=sha256_digest(armed.encode("utf-8")))
    refused = refuse_caller(attempt, run_id="run-1", token=offered)
    assert (refused is None) == (armed == offered)


def test_a_stored_digest_of_another_form_never_matches() -> None:
    attempt = Attempt(callback_token_digest=TOKEN)  # the plaintext itself is not a digest
    assert refuse_caller(attempt, run_id="run-1", token=TOKEN) == Refused(WRONG_TOKEN)


# -- rules 2 and 3: already ended, sequence, latest attempt ---------------------------------

statuses = st.sampled_from(list(AttemptStatus))
run_statuses = st.sampled_from(list(RunStatus))


@given(statuses, run_statuses, st.integers(-5, 5), st.integers(0, 5), st.integers(1, 5))
def test_an_ended_attempt_or_run_answers_already_terminal_before_any_other_rule(
    status: AttemptStatus, run_status: RunStatus, sequence: int, stored: int, latest: int
) -> None:
    attempt = Attempt(status=status, callback_sequence=stored)
    run = RunRow(status=run_status, latest_attempt=latest)
    decision = decide(attempt, run, sequence=sequence)
    ended = status in TERMINAL_ATTEMPT or run_status in TERMINAL_RUN
    assert isinstance(decision, AlreadyEnded) == ended
    if ended:
        assert decision == AlreadyEnded(run_status)


@given(st.integers(0, 10), st.integers(-3, 12))
def test_a_sequence_not_newer_than_the_stored_one_is_refused(stored: int, sequence: int) -> None:
    decision = decide(Attempt(callback_sequence=stored), sequence=sequence)
    if sequence <= stored:
        assert decision == Refused(WRONG_SEQUENCE)
    else:
        assert isinstance(decision, Accepted)


def test_an_attempt_that_is_no_longer_the_runs_latest_is_refused() -> None:
    assert decide(Attempt(number=1), RunRow(latest_attempt=2)) == Refused(NOT_LATEST_ATTEMPT)


def test_a_stale_sequence_is_reported_before_a_superseded_attempt() -> None:
    stale = decide(Attempt(number=1, callback_sequence=1), RunRow(latest_attempt=2), sequence=1)
    assert stale == Refused(WRONG_SEQUENCE)


@given(
    statuses, run_statuses, st.integers(0, 3), st.integers(-1, 4), st.integers(1, 3),
    st.integers(1, 3),
)  # fmt: skip
def test_an_ending_is_accepted_exactly_for_the_active_latest_attempt_with_a_newer_sequence(
    status: AttemptStatus,
    run_status: RunStatus,
    stored: int,
    sequence: int,
    number: int,
    latest: int,
) -> None:
    attempt = Attempt(status=status, callback_sequence=stored, number=number)
    run = RunRow(status=run_status, latest_attempt=latest)
    accepted = isinstance(decide(attempt, run, sequence=sequence), Accepted)
    assert accepted == (
        status not in TERMINAL_ATTEMPT
        and run_status not in TERMINAL_RUN
        and sequence > stored
        and number == latest
    )


# -- rule 4: the starting → running catch-up ------------------------------------------------


def test_a_running_attempt_needs_no_catch_up() -> None:
    decision = decide(Attempt(status=AttemptStatus.RUNNING), started=CREATED + 99)
    assert isinstance(decision, Accepted) and decision.catch_up_started_at_ms is None


def test_a_starting_attempt_first_catches_up_with_the_shims_start_time() -> None:
    starting = Attempt(status=AttemptStatus.STARTING, started_at_ms=None)
    decision = decide(starting, RunRow(status=RunStatus.DISPATCHING), started=CREATED + 40)
    assert isinstance(decision, Accepted)
    assert decision.catch_up_started_at_ms == CREATED + 40


@pytest.mark.parametrize("started", [None, 0, CREATED - 1])
def test_a_catch_up_never_starts_before_the_attempt_was_created(started: int | None) -> None:
    starting = Attempt(status=AttemptStatus.STARTING, started_at_ms=None)
    decision = decide(starting, RunRow(status=RunStatus.DISPATCHING), started=started)
    assert isinstance(decision, Accepted) and decision.catch_up_started_at_ms == CREATED


# -- rule 5: which ending, which times ------------------------------------------------------


@pytest.mark.parametrize(
    ("exit_code", "signal", "cancel", "ending", "stored_exit"),
    [
        (0, None, None, AttemptStatus.SUCCEEDED, 0),
        (3, None, None, AttemptStatus.FAILED, 3),
        (0, 9, None, AttemptStatus.FAILED, None),  # a signal: no exit code is stored
        (0, None, "user", AttemptStatus.CANCELLED, 0),  # the committed intent wins
        (0, 15, "timeout", AttemptStatus.TIMED_OUT, None),
    ],
)
def test_the_ending_follows_the_exit_status_unless_a_cancel_intent_names_it(
    exit_code: int, signal: int | None, cancel: str | None, ending: AttemptStatus,
    stored_exit: int | None,
) -> None:  # fmt: skip
    decision = decide(Attempt(), RunRow(cancel_reason=cancel), exit_code=exit_code, signal=signal)
    assert isinstance(decision, Accepted)
    assert (decision.ending, decision.exit_code, decision.signal) == (ending, stored_exit, signal)


@given(
    st.sampled_from([AttemptStatus.STARTING, AttemptStatus.RUNNING]),
    st.one_of(st.none(), st.integers(0, 2 * CREATED)),
    st.one_of(st.none(), st.integers(0, 2 * CREATED)),
    st.integers(0, 2 * CREATED),
)
def test_times_never_run_backwards_relative_to_what_is_committed(
    status: AttemptStatus, stored_start: int | None, shim_start: int | None, finished: int
) -> None:
    if stored_start is not None:
        stored_start = max(stored_start, CREATED)  # T2 never records a start before T1
    attempt = Attempt(status=status, started_at_ms=stored_start)
    decision = decide(attempt, finished=finished, started=shim_start)
    assert isinstance(decision, Accepted)
    start = decision.catch_up_started_at_ms or attempt.started_at_ms or CREATED
    assert CREATED <= start <= decision.finished_at_ms
    assert decision.finished_at_ms == max(finished, start)
