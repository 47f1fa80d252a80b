"""A pass that keeps failing logs when it starts, once a minute after, and when it recovers
(app/failure_log.py): the database away for an hour is not 3,600 same lines."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from app.domain.errors import NotMigrated
from app.failure_log import FailureLog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def failures(clock: Clock, caplog: pytest.LogCaptureFixture) -> Iterator[FailureLog]:
    """The schedule pass's FailureLog on a fake clock, its INFO lines and up captured."""
    with caplog.at_level(logging.INFO, logger="qinglong.test"):
        yield FailureLog(logging.getLogger("qinglong.test"), "schedule pass", clock=clock)


def test_a_failure_is_logged_when_it_starts_then_once_a_minute_then_its_end(
    caplog: pytest.LogCaptureFixture, clock: Clock, failures: FailureLog
) -> None:
    for second in range(150):  # a pass a second for 150 s, all refused the same way
        clock.now = float(second)
        failures.failed(NotMigrated())
    clock.now = 150.0
    failures.failed(RuntimeError("a detail that is never logged"))  # another kind: at once
    failures.succeeded()
    failures.succeeded()  # nothing more: it was not failing
    assert caplog.messages == [
        "schedule pass failed: NotMigrated",
        "schedule pass failed: NotMigrated (59 more time(s) since the last line)",
        "schedule pass failed: NotMigrated (59 more time(s) since the last line)",
        "schedule pass failed: RuntimeError",
        "schedule pass works again after 151 failure(s)",
    ]
    assert [r.levelno for r in caplog.records] == [logging.ERROR] * 4 + [logging.INFO]
    caplog.clear()
    # On and off within the minute, in turns of two kinds: nothing more is written.
    for kind in (NotMigrated(), RuntimeError(), NotMigrated(), RuntimeError()):
        clock.now += 5
        failures.failed(kind)
        failures.succeeded()
    assert caplog.messages == []
    clock.now += 60  # a minute later, a new outage: said at once, with what went unsaid
    failures.failed(NotMigrated())
    failures.succeeded()
    assert caplog.messages == [
        "schedule pass failed: NotMigrated (31 more time(s) since the last line)",
        "schedule pass works again after 5 failure(s)",
    ]


def test_the_log_never_ends_on_a_failure_the_pass_recovered_from(
    caplog: pytest.LogCaptureFixture, clock: Clock, failures: FailureLog
) -> None:
    # The third review: a failure line written after a suppressed recovery had no recovery.
    failures.failed(NotMigrated())
    clock.now = 1.0
    failures.succeeded()
    clock.now = 30.0
    failures.failed(RuntimeError())  # a new kind: written
    clock.now = 31.0
    failures.succeeded()  # within the minute, but after a failure line: written too
    assert caplog.messages == [
        "schedule pass failed: NotMigrated",
        "schedule pass works again after 1 failure(s)",
        "schedule pass failed: RuntimeError",
        "schedule pass works again after 1 failure(s)",
    ]
