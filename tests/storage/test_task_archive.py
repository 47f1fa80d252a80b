"""An archive and a schedule that would fire for its task are one after the other, never
both decided on the state before the other (docs/api.md §4): on PostgreSQL the task's
advisory lock orders them, on SQLite the one writer does."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, insert

from app.domain.errors import Conflict, ErrorCode
from app.domain.model import ScheduleDefinition
from app.storage.definitions_repo import lock_task
from app.storage.runs_repo import RunRepository
from app.storage.schedules_repo import ScheduleRepository
from app.storage.tables import task_archive
from app.storage.uow import UnitOfWork
from tests.storage.helpers import define_task


def _refusal_of_a_write_during_an_archive(engine: Engine, write: Callable[[], object]) -> Conflict:
    """Run ``write`` in another thread while an archive of ``job`` holds its transaction open
    after its write: it must wait for the commit (not decide before it), then be refused."""
    outcome: list[BaseException | None] = []

    def other_write() -> None:
        try:
            write()
            outcome.append(None)
        except BaseException as exc:  # handed to the test's thread
            outcome.append(exc)

    with UnitOfWork(engine) as uow:  # an archive's transaction, caught after its write
        lock_task(uow.conn, "job")
        uow.conn.execute(
            insert(task_archive).values(task="job", archived_at_ms=1, version=1, updated_at_ms=1)
        )
        other = threading.Thread(target=other_write)
        other.start()
        other.join(0.5)
        assert other.is_alive(), outcome  # it waits for the archive: it has not decided yet
        uow.commit()
    other.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], Conflict), outcome
    assert outcome[0].code == ErrorCode.TASK_ARCHIVED
    return outcome[0]


def test_a_schedule_put_while_an_archive_commits_waits_for_it_and_is_refused(
    engine: Engine,
) -> None:
    define_task(engine, "job")
    definition = ScheduleDefinition(task="job", revision=None, cron=None, every_seconds=3600)
    schedules = ScheduleRepository(engine)
    _refusal_of_a_write_during_an_archive(
        engine, lambda: schedules.put_schedule(name="tick", definition=definition, paused=False)
    )
    with pytest.raises(Conflict):  # and nothing was stored meanwhile
        schedules.put_schedule(name="tick", definition=definition, paused=False)
    assert schedules.list_schedules(limit=5, cursor=None).items == []


def test_an_enqueue_while_an_archive_commits_waits_for_it_and_is_refused(engine: Engine) -> None:
    define_task(engine, "job")
    repo = RunRepository(engine)
    _refusal_of_a_write_during_an_archive(
        engine, lambda: repo.enqueue_run(task="job", revision=None, priority=None)
    )
    assert repo.queued_count() == 0  # and no run was stored
