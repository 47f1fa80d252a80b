"""PostgreSQL pool: an idle connection the server cut is replaced before anyone uses it.

The engine pings only connections that sat idle (not every checkout); this proves the
ping still happens where it matters, against a real server that really closed the backend.
"""

from __future__ import annotations

import threading
import time
from urllib.parse import quote

import pytest
from sqlalchemy import create_engine, make_url, select, text
from sqlalchemy.exc import OperationalError

from app.domain.errors import DatabaseUnreachable
from app.storage import engine as engine_module
from app.storage.engine import make_engine
from app.storage.run_reads import RunReader
from app.storage.tables import runs
from app.storage.uow import UnitOfWork
from tests.storage.helpers import define_task, enqueue


@pytest.mark.postgres
def test_an_idle_connection_cut_by_the_server_is_replaced(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "PING_AFTER_IDLE_S", 0.05)
    engine = make_engine(postgres_url)
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    try:
        define_task(engine, task="pool")
        run = enqueue(engine, task="pool")
        with engine.connect() as conn:
            backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        assert engine.pool.checkedin() == 1  # the connection waits in the pool
        with admin.connect() as conn:
            # With a timeout, it returns once the backend has exited (PostgreSQL 14+), not
            # when the signal was sent: the pooled connection is surely dead below.
            ended = conn.execute(text("SELECT pg_terminate_backend(:p, 5000)"), {"p": backend})
            assert ended.scalar()
        time.sleep(0.1)  # idle longer than the ping threshold
        # Both the transactional path and the one-statement read path get a live connection.
        assert RunReader(engine).get_run(run.id).id == run.id
        with engine.connect() as conn:
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() != backend
    finally:
        admin.dispose()
        engine.dispose()


@pytest.mark.postgres
def test_reads_keep_their_prepared_statements(postgres_url: str) -> None:
    # psycopg drops a connection's prepared statements on ROLLBACK; a read unit of work
    # therefore ends with COMMIT on PostgreSQL, so a hot read is prepared once and reused.
    engine = make_engine(postgres_url, connections=1)
    try:
        define_task(engine, task="prepared")
        run = enqueue(engine, task="prepared")
        statement = select(runs.c.status).where(runs.c.id == run.id)
        for _ in range(8):  # past psycopg's prepare threshold (5)
            with UnitOfWork(engine, write=False) as uow:
                assert uow.conn.execute(statement).scalar_one() == "queued"
        with UnitOfWork(engine, write=False) as uow:
            backend = uow.conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            prepared = uow.conn.execute(
                text("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE :q"),
                {"q": "SELECT runs.status%"},
            ).scalar_one()
        assert prepared == 1
        with engine.connect() as conn:  # the same pooled connection served every read
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() == backend
        # A read that failed still rolls back (and so starts clean).
        with pytest.raises(ZeroDivisionError), UnitOfWork(engine, write=False) as uow:
            uow.conn.execute(statement)
            raise ZeroDivisionError
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_burst_wider_than_the_pool_reuses_its_connections(postgres_url: str) -> None:
    # More threads than connections: they wait for one instead of opening a short-lived
    # extra one (a new server process, its prepared statements lost at its checkin).
    engine = make_engine(postgres_url, connections=3)
    backends: set[int] = set()
    lock = threading.Lock()
    start = threading.Barrier(8, timeout=30)

    def work() -> None:
        start.wait()
        for _ in range(15):
            with UnitOfWork(engine, write=False) as uow:
                backend = uow.conn.execute(text("SELECT pg_backend_pid(), pg_sleep(0.002)"))
                pid = backend.scalar_one()
            with lock:
                backends.add(pid)

    try:
        threads = [threading.Thread(target=work) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(backends) == 3  # all three used, none more ever made
        assert engine.pool.checkedin() == 3  # and all three still open in the pool
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_one_statement_unit_of_work_is_its_own_transaction(postgres_url: str) -> None:
    # One statement needs no BEGIN and COMMIT of its own (two round trips on the launch
    # path, app/storage/journal_repo.py reserve): each statement is then a transaction, and
    # the pooled connection is handed to the next unit of work transactional again.
    engine = make_engine(postgres_url, connections=1)
    xact = text("SELECT pg_current_xact_id()")
    try:
        with UnitOfWork(engine, one_statement=True) as uow:
            assert uow.conn.connection.dbapi_connection.autocommit is True  # type: ignore[union-attr]
            assert uow.conn.execute(xact).scalar_one() != uow.conn.execute(xact).scalar_one()
            uow.commit()
        with UnitOfWork(engine) as uow:
            assert uow.conn.connection.dbapi_connection.autocommit is False  # type: ignore[union-attr]
            assert uow.conn.execute(xact).scalar_one() == uow.conn.execute(xact).scalar_one()
            uow.commit()
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_session_left_idle_inside_a_transaction_is_ended_and_its_locks_freed(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process frozen mid-transaction (a partitioned host) must not hold its row locks
    # until TCP notices: the server ends the session. The URL's own options (here the test
    # schema's search_path) stay in force beside the setting.
    monkeypatch.setattr(engine_module, "PG_IDLE_IN_TRANSACTION_TIMEOUT_MS", 300)
    engine = make_engine(postgres_url)
    try:
        define_task(engine, task="idle")
        run = enqueue(engine, task="idle")
        locked = select(runs.c.id).where(runs.c.id == run.id).with_for_update()
        frozen = engine.connect()
        try:
            frozen.execute(locked)  # then nothing more: the process froze here
            with engine.connect() as other:
                setting = other.exec_driver_sql("SHOW idle_in_transaction_session_timeout")
                assert setting.scalar_one() == "300ms"
                schema = str(make_url(postgres_url).query["options"]).split("search_path=")[1]
                assert other.exec_driver_sql("SHOW search_path").scalar_one() == schema
                # Held now: another transaction cannot take the row.
                with pytest.raises(OperationalError):
                    other.execute(locked.with_for_update(nowait=True))
                other.rollback()
                # The server ends the frozen session 300 ms after its last statement: the row
                # is free then (retried, as a loaded host may run that timer late).
                deadline = time.monotonic() + 10
                while True:
                    time.sleep(0.2)
                    try:
                        taken = other.execute(locked.with_for_update(nowait=True)).scalar_one()
                        break
                    except OperationalError:
                        other.rollback()
                        assert time.monotonic() < deadline, "the frozen session kept the row"
                assert taken == run.id
                other.rollback()
            with pytest.raises(DatabaseUnreachable):  # the frozen one's session is gone
                frozen.execute(text("SELECT 1"))
            assert frozen.invalidated  # not handed back to the pool
        finally:
            frozen.invalidate()
            frozen.close()
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_the_timeout_keeps_pgoptions_and_yields_to_one_the_url_sets(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # libpq reads PGOPTIONS only when no options are given: the engine must not drop it.
    base = postgres_url.split("?")[0]
    monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=1234")
    cases = {
        base: ("1234ms", "1min"),
        f"{base}?options={quote('-c idle_in_transaction_session_timeout=5000')}": ("0", "5s"),
    }
    for url, expected in cases.items():
        engine = make_engine(url)
        try:
            with engine.connect() as conn:
                seen = tuple(
                    conn.exec_driver_sql(f"SHOW {name}").scalar_one()
                    for name in ("statement_timeout", "idle_in_transaction_session_timeout")
                )
        finally:
            engine.dispose()
        assert seen == expected, url
