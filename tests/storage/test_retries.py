"""Retries through the real transactions, on SQLite and PostgreSQL (docs/retries.md).

The ending of attempt n and the creation of attempt n+1 are one transaction: an error after
both are written leaves neither (no crash window between them exists to inject). A waiting
attempt is no dispatch candidate and T1 refuses it before its instant; a cancel during the
wait ends the run at once; a lost whose processes are not proven gone is not retried.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine

from app.domain.errors import ErrorCode, InvalidTransition
from app.domain.ids import now_ms
from app.domain.retry import RetryPolicy
from app.storage import runs_repo
from app.storage.definitions_repo import DefinitionRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from tests.storage.helpers import TOKEN, dispatch, enqueue, event_types, start

TERMINAL = {f"run.{s}" for s in ("succeeded", "failed", "cancelled", "timed_out", "lost")}


def _define(engine: Engine, **policy: Any) -> None:
    DefinitionRepository(engine).put_revision(
        task="job", revision=1, executor="local_process", argv=["/bin/true"], cwd=None,
        recipe=None, timeout_seconds=None, priority=0, retry=RetryPolicy(**policy),
    )  # fmt: skip


def _complete(engine: Engine, run_id: str, attempt_id: str, exit_code: int) -> str | None:
    outcome = RunRepository(engine).complete_attempt(
        run_id=run_id, attempt_id=attempt_id, token=TOKEN, callback_sequence=1,
        exit_code=exit_code, signal=None, finished_at_ms=now_ms(),
    )  # fmt: skip
    assert outcome.status == "applied"
    return outcome.run_status


def test_a_failed_attempt_is_followed_by_a_claimed_one_in_the_same_step(engine: Engine) -> None:
    _define(engine, max_attempts=2, initial_delay_seconds=3600, max_delay_seconds=3600)
    run = start(engine, enqueue(engine))
    assert run.latest_attempt is not None
    before = now_ms()
    assert _complete(engine, run.id, run.latest_attempt.id, exit_code=3) == "queued"
    reader = RunReader(engine)
    queued = reader.get_run(run.id)
    assert queued.latest_attempt is not None
    assert (queued.status, queued.attempts, queued.latest_attempt.status) == (
        "queued",
        2,
        "claimed",
    )
    waits_until = queued.next_attempt_at_ms
    assert waits_until is not None and before + 3_600_000 <= waits_until <= now_ms() + 3_600_000
    assert reader.get_attempt(run.id, 1).exit_code == 3
    events = reader.list_events(run.id).items
    assert [e.type for e in events][-3:] == [
        "attempt.failed", "run.retry_scheduled", "attempt.claimed",
    ]  # fmt: skip
    assert events[-2].data == {"attempt": 2, "not_before_ms": waits_until}
    assert not TERMINAL & {e.type for e in events}
    # Waiting: no candidate (not even promoted), T1 refuses it, the loop knows when to wake.
    assert RunRepository(engine).promote_due_retries(limit=16) == 0
    assert reader.dispatch_candidates(limit=4).items == []
    assert reader.next_retry_at_ms(after_ms=now_ms()) == waits_until
    with pytest.raises(InvalidTransition, match="retry time"):
        dispatch(engine, queued)
    # A cancel during the wait ends the run at once, with its one terminal event.
    cancelled = RunRepository(engine).request_cancel(run_id=run.id, reason="user")
    assert (cancelled.status, cancelled.next_attempt_at_ms) == ("cancelled", None)
    assert [t for t in event_types(engine, run.id) if t in TERMINAL] == ["run.cancelled"]
    assert reader.next_retry_at_ms(after_ms=now_ms()) is None


def test_an_error_after_the_ending_and_the_retry_were_written_leaves_neither(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _define(engine, max_attempts=3, initial_delay_seconds=0, on=("failed",))
    run = start(engine, enqueue(engine))
    assert run.latest_attempt is not None
    original = runs_repo._append_events

    def then_fail(conn: Any, run_id: str, first_seq: int, at: int, events: Any) -> None:
        events = list(events)
        original(conn, run_id, first_seq, at, events)  # the ending and attempt 2: written
        if any(e.type == "run.retry_scheduled" for e in events):
            raise RuntimeError("crash inside the ending's transaction")

    monkeypatch.setattr(runs_repo, "_append_events", then_fail)
    with pytest.raises(RuntimeError):
        _complete(engine, run.id, run.latest_attempt.id, exit_code=1)
    monkeypatch.undo()
    reader = RunReader(engine)
    same = reader.get_run(run.id)
    assert (same.status, same.version, same.attempts) == ("running", run.version, 1)
    assert [a.status for a in reader.list_attempts(run.id)] == ["running"]
    # Replayed, the ending and the retry commit together; once promoted (its instant has
    # passed: no delay) the retry is a candidate again.
    assert _complete(engine, run.id, run.latest_attempt.id, exit_code=1) == "queued"
    assert [a.status for a in reader.list_attempts(run.id)] == ["failed", "claimed"]
    assert reader.dispatch_candidates(limit=4).items == []
    assert RunRepository(engine).promote_due_retries(limit=16) == 1
    assert [c.run_id for c in reader.dispatch_candidates(limit=4).items] == [run.id]


def test_lost_is_retried_only_when_its_processes_are_proven_gone(engine: Engine) -> None:
    _define(engine, max_attempts=5, initial_delay_seconds=0, on=("lost",))
    repo, reader = RunRepository(engine), RunReader(engine)
    run = start(engine, enqueue(engine))
    assert run.latest_attempt is not None
    after = repo.fail_attempt(
        run_id=run.id, attempt_id=run.latest_attempt.id, lost=True,
        error_code=ErrorCode.RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT,
    )  # fmt: skip
    assert (after.status, after.attempts) == ("queued", 2)
    repo.promote_due_retries(limit=16)
    second = start(engine, reader.get_run(run.id))
    assert second.latest_attempt is not None and second.latest_attempt.number == 2
    ended = repo.fail_attempt(
        run_id=run.id, attempt_id=second.latest_attempt.id, lost=True,
        error_code=ErrorCode.RECOVERY_IDENTITY_UNSUPPORTED,
    )  # fmt: skip
    assert (ended.status, ended.attempts, ended.next_attempt_at_ms) == ("lost", 2, None)
    assert [t for t in event_types(engine, run.id) if t in TERMINAL] == ["run.lost"]


def test_only_the_attempts_own_deadline_may_stand_behind_a_retry(engine: Engine) -> None:
    _define(engine, max_attempts=3, initial_delay_seconds=0, on=("failed", "timed_out"))
    repo, reader = RunRepository(engine), RunReader(engine)
    run = start(engine, enqueue(engine))
    assert run.latest_attempt is not None
    repo.request_cancel(run_id=run.id, reason="timeout")  # its deadline passed
    assert _complete(engine, run.id, run.latest_attempt.id, exit_code=143) == "queued"
    retried = reader.get_run(run.id)
    assert (retried.attempts, retried.cancel) == (2, None)  # attempt 2 gets its own deadline
    assert reader.get_attempt(run.id, 1).status == "timed_out"
    repo.promote_due_retries(limit=16)
    second = start(engine, reader.get_run(run.id))
    assert second.latest_attempt is not None
    repo.request_cancel(run_id=run.id, reason="user")  # a user's cancel ends the run
    assert _complete(engine, run.id, second.latest_attempt.id, exit_code=143) == "cancelled"
    assert [t for t in event_types(engine, run.id) if t in TERMINAL] == ["run.cancelled"]
