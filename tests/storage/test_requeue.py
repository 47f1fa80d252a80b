"""The requeue of a start that spawned nothing, on SQLite and PostgreSQL: one transaction.

The attempt ends failed EXECUTOR_UNAVAILABLE, the run goes back to queued with a fresh
claimed attempt, three events, all or nothing; a cancel intent or the bound end it instead.
"""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine, func, select

from app.domain.errors import DomainError, InvalidTransition, NotFound
from app.domain.states import MAX_UNAVAILABLE_ATTEMPTS
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.storage.tables import attempts
from tests.storage.helpers import define_task, dispatch, enqueue, event_types, start

TERMINAL_RUN_EVENTS = {f"run.{s}" for s in ("succeeded", "failed", "cancelled", "timed_out", "lost")}


def _requeue(engine: Engine, run_id: str) -> object:
    run = RunReader(engine).get_run(run_id)
    assert run.latest_attempt is not None
    return RunRepository(engine).requeue_unspawned(run_id=run.id, attempt_id=run.latest_attempt.id)


def _attempt_count(engine: Engine, run_id: str) -> int:
    with engine.connect() as conn:
        count = conn.execute(
            select(func.count()).select_from(attempts).where(attempts.c.run_id == run_id)
        ).scalar()
    return int(count or 0)


def test_requeue_ends_the_attempt_and_claims_a_fresh_one_in_one_step(engine: Engine) -> None:
    define_task(engine)
    run = dispatch(engine, enqueue(engine))
    assert run.latest_attempt is not None
    first = run.latest_attempt.id
    after = RunRepository(engine).requeue_unspawned(run_id=run.id, attempt_id=first)
    reader = RunReader(engine)
    assert after == reader.get_run(run.id)
    assert (after.status, after.version) == ("queued", 6)
    assert after.latest_attempt is not None
    assert (after.latest_attempt.number, after.latest_attempt.status) == (2, "claimed")
    old = reader.get_attempt(run.id, 1)
    assert (old.id, old.status, old.error_code) == (first, "failed", "EXECUTOR_UNAVAILABLE")
    assert event_types(engine, run.id) == [
        "run.queued", "run.dispatching", "attempt.starting",
        "attempt.failed", "run.queued", "attempt.claimed",
    ]  # fmt: skip
    requeue_events = reader.list_events(run.id, limit=10).items[3:]
    assert [e.data for e in requeue_events] == [
        {"attempt": 1, "error_code": "EXECUTOR_UNAVAILABLE"}, {"attempt": 2}, {"attempt": 2},
    ]  # fmt: skip
    # It is a dispatch candidate again, and the fresh attempt starts normally.
    page = reader.dispatch_candidates(limit=4)
    assert [(c.run_id, c.attempt_number) for c in page.items] == [(run.id, 2)]
    assert start(engine, after).status == "running"


def test_a_raise_inside_the_requeue_leaves_nothing_half_written(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.storage.runs_repo as runs_repo

    define_task(engine)
    run = dispatch(engine, enqueue(engine))

    def crash(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("injected crash after the CAS updates and the insert")

    # The run row, the old attempt and the fresh attempt are all written when this raises.
    monkeypatch.setattr(runs_repo, "_append_events", crash)
    with pytest.raises(RuntimeError, match="injected"):
        _requeue(engine, run.id)
    monkeypatch.undo()
    now = RunReader(engine).get_run(run.id)
    assert (now.status, now.version) == ("dispatching", 3)
    assert now.latest_attempt is not None
    assert (now.latest_attempt.number, now.latest_attempt.status) == (1, "starting")
    assert now.latest_attempt.error_code is None
    assert _attempt_count(engine, run.id) == 1
    assert event_types(engine, run.id) == ["run.queued", "run.dispatching", "attempt.starting"]
    # And the same requeue then succeeds normally.
    assert getattr(_requeue(engine, run.id), "status", None) == "queued"


def test_requeue_is_refused_once_the_start_moved_on(engine: Engine) -> None:
    define_task(engine)
    repo = RunRepository(engine)
    queued = enqueue(engine)
    assert queued.latest_attempt is not None
    with pytest.raises(InvalidTransition):  # never dispatched: nothing to requeue
        repo.requeue_unspawned(run_id=queued.id, attempt_id=queued.latest_attempt.id)
    running = start(engine, enqueue(engine))
    with pytest.raises(InvalidTransition):  # a handle was recorded: it spawned
        _requeue(engine, running.id)
    run = dispatch(engine, enqueue(engine))
    assert run.latest_attempt is not None
    _requeue(engine, run.id)
    with pytest.raises(NotFound):  # the same (now old) attempt again: no second ending
        repo.requeue_unspawned(run_id=run.id, attempt_id=run.latest_attempt.id)
    assert _attempt_count(engine, run.id) == 2


def test_concurrent_requeues_of_one_start_have_exactly_one_winner(engine: Engine) -> None:
    define_task(engine)
    run = dispatch(engine, enqueue(engine))
    assert run.latest_attempt is not None
    barrier = threading.Barrier(4)
    results: list[object] = []

    def go() -> None:
        barrier.wait()
        try:
            results.append(
                RunRepository(engine).requeue_unspawned(
                    run_id=run.id, attempt_id=run.latest_attempt.id  # type: ignore[union-attr]
                )
            )
        except DomainError as exc:
            results.append(exc)

    threads = [threading.Thread(target=go) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sum(not isinstance(r, DomainError) for r in results) == 1, results
    assert _attempt_count(engine, run.id) == 2
    assert event_types(engine, run.id).count("attempt.claimed") == 1


def test_a_cancel_intent_ends_the_run_instead_of_requeueing_it(engine: Engine) -> None:
    define_task(engine)
    repo = RunRepository(engine)
    for reason, ending in (("user", "cancelled"), ("timeout", "timed_out")):
        run = dispatch(engine, enqueue(engine))
        repo.request_cancel(run_id=run.id, reason=reason)  # type: ignore[arg-type]
        after = _requeue(engine, run.id)
        assert getattr(after, "status", None) == ending
        assert _attempt_count(engine, run.id) == 1
        types = event_types(engine, run.id)
        assert types[-2:] == [f"attempt.{ending}", f"run.{ending}"]
        assert [t for t in types if t in TERMINAL_RUN_EVENTS] == [f"run.{ending}"]


def test_the_bounded_requeues_end_in_one_failed_executor_unavailable(engine: Engine) -> None:
    define_task(engine)
    run = enqueue(engine)
    for number in range(1, MAX_UNAVAILABLE_ATTEMPTS):
        run = dispatch(engine, RunReader(engine).get_run(run.id))
        requeued = _requeue(engine, run.id)
        assert getattr(requeued, "status", None) == "queued", number
    run = dispatch(engine, RunReader(engine).get_run(run.id))
    ended = RunReader(engine).get_run(getattr(_requeue(engine, run.id), "id", ""))
    assert ended.status == "failed" and ended.latest_attempt is not None
    assert (ended.latest_attempt.number, ended.latest_attempt.error_code) == (
        MAX_UNAVAILABLE_ATTEMPTS,
        "EXECUTOR_UNAVAILABLE",
    )
    types = event_types(engine, run.id)
    assert [t for t in types if t in TERMINAL_RUN_EVENTS] == ["run.failed"]
    assert types.count("attempt.failed") == MAX_UNAVAILABLE_ATTEMPTS
    assert _attempt_count(engine, run.id) == MAX_UNAVAILABLE_ATTEMPTS
