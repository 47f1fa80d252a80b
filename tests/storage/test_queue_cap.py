"""The queued-run cap (QL_MAX_QUEUED, docs/concurrency-budgets.md §3) is exact under concurrency."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Engine

from app.domain.errors import QueueFull
from app.storage.engine import make_engine
from app.storage.runs_repo import RunRepository, queue_has_room
from app.storage.uow import UnitOfWork
from tests.storage.helpers import define_task, dispatch, enqueue

CAP = 5
WRITERS = 6
POSTS = 4


def test_enqueue_at_the_cap_raises_queue_full_and_a_replay_still_returns_its_run(
    engine: Engine,
) -> None:
    define_task(engine)
    repo = RunRepository(engine)
    first, created = repo.enqueue_run(
        task="job", revision=None, priority=None, token_id="t", idempotency_key="k",
        request_digest="d", max_queued=2,
    )  # fmt: skip
    assert created
    repo.enqueue_run(task="job", revision=None, priority=None, max_queued=2)
    with pytest.raises(QueueFull) as caught:
        repo.enqueue_run(task="job", revision=None, priority=None, max_queued=2)
    assert caught.value.retry_after_s == 5
    again, created = repo.enqueue_run(
        task="job", revision=None, priority=None, token_id="t", idempotency_key="k",
        request_digest="d", max_queued=2,
    )  # fmt: skip
    assert (again.id, created) == (first.id, False)
    assert repo.queued_count() == 2


def test_a_dispatched_run_no_longer_counts_as_queued(engine: Engine) -> None:
    define_task(engine)
    repo = RunRepository(engine)
    runs = [enqueue(engine) for _ in range(3)]
    dispatch(engine, runs[0])
    assert repo.queued_count() == 2
    with UnitOfWork(engine) as uow:
        assert queue_has_room(uow.conn, 3)
        assert not queue_has_room(uow.conn, 2)


def test_concurrent_writers_with_their_own_connections_never_overshoot_the_cap(
    engine: Engine, db_url: str
) -> None:
    """Six writers post four runs each at once against a cap of five: exactly five are queued."""
    define_task(engine)
    engines = [make_engine(db_url) for _ in range(WRITERS)]
    barrier = threading.Barrier(WRITERS)
    created: list[str] = []
    refused: list[int] = []
    errors: list[BaseException] = []

    def post(own: Engine) -> None:
        repo = RunRepository(own)
        try:
            barrier.wait(timeout=30)
            for _ in range(POSTS):
                try:
                    run, _ = repo.enqueue_run(
                        task="job", revision=None, priority=None, max_queued=CAP
                    )
                    created.append(run.id)
                except QueueFull:
                    refused.append(1)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=post, args=(e,)) for e in engines]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        for own in engines:
            own.dispose()
    assert errors == []
    assert (len(created), len(refused)) == (CAP, WRITERS * POSTS - CAP)
    assert RunRepository(engine).queued_count() == CAP
