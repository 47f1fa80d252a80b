"""The budget locks are per schema, and still exclude a process of the build before them.

On PostgreSQL the queue cap and T1's budgets are exact because each check and its write
run under a transaction-scoped advisory lock (app/storage/runs_repo.py). Two installations
in two schemas of one database must not wait for each other on it; a process of the
previous build, which takes one database-wide lock, must still exclude this build's
during a rolling upgrade (docs/concurrency-budgets.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine, make_url, text

from app.storage.engine import make_engine
from app.storage.runs_repo import _QUEUE_LOCK, RunRepository, queue_has_room
from app.storage.uow import UnitOfWork
from tests.conftest import private_pg_schema
from tests.storage.helpers import define_task

pytestmark = pytest.mark.postgres


@pytest.fixture
def two_schemas() -> Iterator[tuple[Engine, Engine]]:
    with private_pg_schema("ql_lock_a") as a, private_pg_schema("ql_lock_b") as b:
        engines = make_engine(a), make_engine(b)
        try:
            for engine in engines:
                define_task(engine)
            yield engines
        finally:
            for engine in engines:
                engine.dispose()


def _in_thread(work: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    done: list[object] = []
    thread = threading.Thread(target=lambda: done.append(work()), daemon=True)
    thread.start()
    return thread, done


def _capped_enqueue(engine: Engine) -> Callable[[], object]:
    repo = RunRepository(engine)
    return lambda: repo.enqueue_run(task="job", revision=None, priority=None, max_queued=10)


def test_an_enqueue_in_one_schema_does_not_wait_for_one_holding_the_lock_in_another(
    two_schemas: tuple[Engine, Engine],
) -> None:
    a, b = two_schemas
    with UnitOfWork(a) as held:  # an enqueue in schema a, stalled between check and commit
        assert queue_has_room(held.conn, 10)
        thread, done = _in_thread(_capped_enqueue(b))
        thread.join(10)
        assert done, "an enqueue in another schema waited for this one's lock"
        same, same_done = _in_thread(_capped_enqueue(a))
        same.join(0.5)
        assert same.is_alive() and not same_done  # in its own schema the lock still holds
    same.join(10)
    assert same_done
    assert RunRepository(a).queued_count() == 1 and RunRepository(b).queued_count() == 1


def test_the_previous_builds_database_wide_lock_still_excludes_this_builds(
    two_schemas: tuple[Engine, Engine],
) -> None:
    a, _ = two_schemas
    with a.connect() as old_build:  # takes the queue lock the way the build before did
        old_build.execute(text(f"SELECT pg_advisory_xact_lock({_QUEUE_LOCK})"))
        thread, done = _in_thread(_capped_enqueue(a))
        thread.join(1.0)
        assert thread.is_alive() and not done  # waits for the old process's commit
        old_build.commit()
    thread.join(10)
    assert done
    with a.connect() as old_build:  # and the other way round
        with UnitOfWork(a) as new_build:
            assert queue_has_room(new_build.conn, 10)
            old_build.execute(text("SET LOCAL lock_timeout = '300ms'"))
            with pytest.raises(Exception, match="lock timeout"):
                old_build.execute(text(f"SELECT pg_advisory_xact_lock({_QUEUE_LOCK})"))
        old_build.rollback()


def test_the_lock_follows_the_schema_whose_runs_the_session_uses_not_the_first_on_its_path(
    two_schemas: tuple[Engine, Engine],
) -> None:
    # One installation, two ways to reach it: a search_path that starts with another, empty
    # schema (a "$user" schema, say) still locks the schema that holds ``runs``.
    a, _ = two_schemas
    (schema,) = a.url.query["options"].removeprefix("-csearch_path=").split(",")[:1]
    with private_pg_schema("ql_lock_empty", migrate=False) as empty_url:
        (empty,) = make_url(empty_url).query["options"].removeprefix("-csearch_path=").split(",")
        around = make_engine(
            a.url.update_query_dict(
                {"options": f"-csearch_path={empty},{schema}"}
            ).render_as_string(hide_password=False)
        )
        try:
            with around.connect() as conn:
                assert conn.execute(text("SELECT current_schema()")).scalar_one() == empty
            with UnitOfWork(a) as held:
                assert queue_has_room(held.conn, 10)
                thread, done = _in_thread(_capped_enqueue(around))
                thread.join(0.5)
                assert thread.is_alive() and not done  # the same installation: it waits
            thread.join(10)
            assert done
        finally:
            around.dispose()
