"""A schedule's fire under a queue cap, an enqueue and a waiting archive of the same task never
deadlock on PostgreSQL (docs/concurrency-budgets.md §3).

An enqueue (``POST /runs``) takes the task's advisory lock shared, then the queue's lock; an
archive takes the task's lock alone. A fire under a cap that took the queue's lock first and
the task's second closed a cycle once an archive waited between them: the enqueue held the
task's lock and waited for the queue's, the fire held the queue's and queued for the task's
behind the archive, the archive waited for the enqueue. Nothing moved until PostgreSQL's
deadlock check ran (``deadlock_timeout``, 1 s by default): it found the cycle soft and let
the fire's shared request jump ahead of the archive (so a fire that asked after the archive
still landed before it), or, had it found no request to move, aborted one of them (40P01).
Here the three wait on real connections, each seen waiting in ``pg_locks`` before the next
starts; then the enqueue that holds the task's lock goes on, and everything must be decided
well within the deadlock check's delay (raised to ``DEADLOCK_TIMEOUT_S`` for these
connections, so a loaded machine cannot pass for a stall), in the order the locks were
asked for, with no deadlock error.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, event, func, insert, select, text
from sqlalchemy.exc import DBAPIError

from app.domain.errors import Conflict, ErrorCode
from app.domain.ids import now_ms
from app.domain.model import ScheduleDefinition
from app.storage.definitions_repo import (
    DefinitionRepository,
    lock_task,
    revision_row,
    task_lock_key,
)
from app.storage.runs_repo import RunRepository, enqueue_in
from app.storage.schedules_repo import ScheduleRepository
from app.storage.tables import runs, schedule_decisions, task_archive
from app.storage.uow import UnitOfWork
from tests.conftest import PG_ENV
from tests.storage.helpers import define_task

T0 = 1_699_999_200_000  # the schedule's own clock, in the past (tests/storage/test_schedules.py)
CAP = 10  # a queue cap the test never reaches: only its lock matters
WAIT_S = 10.0
DEADLOCK_TIMEOUT_S = 5  # a stall for the deadlock check shows as this, the test allows half

# Requests for the task's advisory lock (pg_advisory_xact_lock on hashtextextended(key, 0):
# classid holds the high 32 bits, objid the low ones) not granted yet.
_WAITING = text(
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    " AND objsubid = 1"
    " AND ((classid::bigint << 32) | objid::bigint) = hashtextextended(:key, 0)"
)


def _wait_for_waiters(watch: Connection, task: str, count: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        waiting = watch.execute(_WAITING, {"key": task_lock_key(task)}).scalar_one()
        if waiting >= count:
            assert waiting == count
            return
        time.sleep(0.005)
    pytest.fail(f"{count} waiters for the task's lock not seen within {WAIT_S} s")


def _deadlock_in(outcome: object) -> BaseException | None:
    """The exception in ``outcome``'s chain that is PostgreSQL's deadlock error (40P01)."""
    seen = outcome if isinstance(outcome, BaseException) else None
    while seen is not None:
        if getattr(seen, "sqlstate", None) == "40P01":
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


class _Racer(threading.Thread):
    """One writer on its own connection; what it returned or raised."""

    def __init__(self, name: str, write: Callable[[], object]) -> None:
        super().__init__(name=name, daemon=True)
        self._write = write
        self.outcome: object = None

        self.ended = 0.0

    def run(self) -> None:
        try:
            self.outcome = self._write()
        except BaseException as exc:  # handed to the test's thread
            self.outcome = exc
        self.ended = time.monotonic()


@pytest.fixture
def slow_deadlock_check(pg_engine: Engine) -> Iterator[Engine]:
    """``pg_engine`` whose connections wait ``DEADLOCK_TIMEOUT_S`` before a deadlock check.

    Setting ``deadlock_timeout`` takes a superuser (or, PostgreSQL 15+, ``GRANT SET ON
    PARAMETER deadlock_timeout``); under a role without it the test skips: at the default
    1 s a loaded machine could pass for the stall it looks for (docs/testing.md).
    """
    with pg_engine.connect() as probe:
        try:
            probe.execute(text(f"SET deadlock_timeout = '{DEADLOCK_TIMEOUT_S}s'"))
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) != "42501":  # insufficient_privilege
                raise
            pytest.skip(
                f"SET deadlock_timeout needs a superuser or GRANT SET ON PARAMETER; the role "
                f"of {PG_ENV} has neither: {exc.orig}"
            )
        finally:
            probe.rollback()  # the setting goes with the probe's transaction

    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cursor:
            cursor.execute(f"SET deadlock_timeout = '{DEADLOCK_TIMEOUT_S}s'")
        dbapi_conn.commit()

    event.listen(pg_engine, "connect", on_connect)
    pg_engine.dispose()  # the pooled connections come back with the setting
    try:
        yield pg_engine
    finally:
        event.remove(pg_engine, "connect", on_connect)


@pytest.mark.parametrize("archive", ["committed", "refused"])
def test_a_fire_under_a_queue_cap_and_an_enqueue_never_deadlock_with_a_waiting_archive(
    slow_deadlock_check: Engine, archive: str, caplog: pytest.LogCaptureFixture
) -> None:
    pg_engine = slow_deadlock_check
    task = f"job-{uuid.uuid4().hex[:12]}"  # its own lock: other tests' waiters never count
    define_task(pg_engine, task)
    definition = ScheduleDefinition(task=task, revision=None, cron=None, every_seconds=1)
    schedules = ScheduleRepository(pg_engine, max_queued=CAP)
    schedules.put_schedule(name="tick", definition=definition, paused=False, at_ms=T0)
    repo = RunRepository(pg_engine)

    def archive_it() -> object:
        if archive == "refused":  # the archive command: the schedule that fires is not paused
            return DefinitionRepository(pg_engine).set_archived(task, True)
        with UnitOfWork(pg_engine) as uow:  # an archive that commits (the schedule's check aside)
            lock_task(uow.conn, task)
            uow.conn.execute(
                insert(task_archive).values(task=task, archived_at_ms=1, version=1, updated_at_ms=1)
            )
            uow.commit()
        return "archived"

    racers = [
        _Racer("archive", archive_it),
        _Racer("fire", lambda: schedules.fire_due(T0 + 1000)),
        _Racer("enqueue", lambda: repo.enqueue_run(task=task, revision=None, priority=None,
                                                   max_queued=CAP)),
    ]  # fmt: skip
    first: object = "committed"
    caplog.set_level(logging.INFO, logger="qinglong.schedules")
    with pg_engine.connect() as watch, UnitOfWork(pg_engine) as uow:
        # An enqueue caught after its first statement: the revision read that takes the
        # task's lock shared (the one enqueue_in below repeats, already held).
        revision_row(uow.conn, task, None, share_lock=True)
        for waiters, racer in enumerate(racers, start=1):
            racer.start()  # the archive waits for the enqueue, the others behind it
            _wait_for_waiters(watch, task, waiters)
        watch.rollback()
        released = time.monotonic()
        try:
            enqueue_in(uow.conn, task=task, revision=None, priority=None, at=now_ms(),
                       max_queued=CAP)  # fmt: skip
            uow.commit()
        except Exception as exc:
            first = exc
    for racer in racers:
        racer.join(DEADLOCK_TIMEOUT_S + WAIT_S)
        assert not racer.is_alive(), racer.name
    took = max(r.ended for r in racers) - released
    outcomes = {"first enqueue": first} | {r.name: r.outcome for r in racers}
    deadlocked = {name: _deadlock_in(o) for name, o in outcomes.items() if _deadlock_in(o)}
    assert deadlocked == {}, f"PostgreSQL's deadlock check aborted {deadlocked}"
    assert took < DEADLOCK_TIMEOUT_S / 2, f"waited {took:.2f} s for the deadlock check"
    assert first == "committed"  # it held the task's lock before the archive asked for it

    fired, enqueued = outcomes["fire"], outcomes["enqueue"]
    with pg_engine.connect() as conn:
        triggers = sorted(conn.execute(select(runs.c.trigger_kind).where(runs.c.task == task)))
        decisions = conn.execute(select(func.count()).select_from(schedule_decisions)).scalar()
    if archive == "committed":  # the archive won: what waited for it is refused
        assert outcomes["archive"] == "archived"
        assert isinstance(enqueued, Conflict) and enqueued.code == ErrorCode.TASK_ARCHIVED
        assert getattr(fired, "runs_created", None) == 0, fired
        assert f"schedule fire raced: {ErrorCode.TASK_ARCHIVED}" in caplog.text
        assert (triggers, decisions) == ([("manual",)], 0)  # the slot stays due, undecided
    else:  # the archive is refused (a schedule fires the task): every run lands
        refused = outcomes["archive"]
        assert isinstance(refused, Conflict) and refused.code == ErrorCode.TASK_HAS_SCHEDULES
        assert not isinstance(enqueued, BaseException), enqueued
        assert getattr(fired, "runs_created", None) == 1, fired
        assert (triggers, decisions) == ([("manual",), ("manual",), ("schedule",)], 1)
