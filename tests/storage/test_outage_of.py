"""Which driver errors are an outage (503, retry) and which stay errors (app/storage/unavailable.py).

The real cases run against real sockets: a PostgreSQL address that accepts the TCP
connection and never answers (a host that froze, packets dropped) must fail as unreachable
after the connect timeout, on the sync engine and on the event-loop read pool alike.
"""

from __future__ import annotations

import asyncio
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import psycopg.errors as pg
import pytest
from sqlalchemy import func, literal, select

from app.domain.errors import DatabaseBusy, DatabaseUnreachable, NotMigrated
from app.storage import engine as engine_module
from app.storage.async_reads import AsyncReads
from app.storage.engine import make_engine
from app.storage.one_statement import OneStatementRead
from app.storage.tables import runs
from app.storage.unavailable import outage_of
from tests.kit.relay import relayed


@pytest.mark.parametrize(
    "error",
    [pg.ConnectionFailure("x"), pg.AdminShutdown("x"), pg.CannotConnectNow("x"),
     pg.IdleInTransactionSessionTimeout("x")],
)  # fmt: skip
def test_a_connection_the_server_ended_is_unreachable(error: Exception) -> None:
    assert isinstance(outage_of(error, connecting=False, disconnect=False), DatabaseUnreachable)


@pytest.mark.parametrize(
    "error", [pg.ProtocolViolation("x"), pg.UniqueViolation("x"), pg.LockNotAvailable("x")]
)
def test_a_bug_or_a_refusal_is_not_an_outage(error: Exception) -> None:
    # A protocol violation is ours to fix; a lock timeout is handled where it is set.
    assert outage_of(error, connecting=False, disconnect=False) is None


def test_a_failed_connect_is_unreachable_only_while_connecting() -> None:
    refused = psycopg.OperationalError("connection failed: Connection refused")
    assert isinstance(outage_of(refused, connecting=True, disconnect=False), DatabaseUnreachable)
    assert outage_of(refused, connecting=False, disconnect=False) is None
    timed_out = pg.ConnectionTimeout("connection timeout expired")  # no SQLSTATE either
    assert isinstance(outage_of(timed_out, connecting=True, disconnect=False), DatabaseUnreachable)


def test_sqlite_busy_in_every_extended_form_is_busy_and_nothing_else_is() -> None:
    for code in (sqlite3.SQLITE_BUSY, 261, 517):  # plain, _RECOVERY, _SNAPSHOT
        error = sqlite3.OperationalError("database is locked")
        error.sqlite_errorcode = code  # type: ignore[attr-defined]
        assert isinstance(outage_of(error, connecting=False, disconnect=False), DatabaseBusy)
    other = sqlite3.OperationalError("no such function")
    other.sqlite_errorcode = sqlite3.SQLITE_ERROR  # type: ignore[attr-defined]
    assert outage_of(other, connecting=False, disconnect=True) is None


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port whose listener completes TCP handshakes and never says a word."""
    with socket.create_server(("127.0.0.1", 0), backlog=8) as listener:
        yield listener.getsockname()[1]


def test_a_server_that_never_answers_is_unreachable_after_the_connect_timeout(
    silent_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "PG_CONNECT_TIMEOUT_S", 2)  # libpq's least
    url = f"postgresql+psycopg://postgres@127.0.0.1:{silent_server}/test"
    engine = make_engine(url)
    try:
        with pytest.raises(DatabaseUnreachable) as sync:
            engine.connect()
        assert isinstance(sync.value.__cause__, pg.ConnectionTimeout)
        reads = AsyncReads(engine)
        one = OneStatementRead(engine, select(literal(1)))

        async def read() -> None:
            try:
                await reads.rows(one, {})
            finally:
                await reads.aclose()

        with pytest.raises(DatabaseUnreachable) as on_loop:
            asyncio.run(read())
        assert isinstance(on_loop.value.__cause__, pg.ConnectionTimeout)
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_one_statement_read_translates_the_drivers_errors_as_the_engine_does(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Below Connection.execute the engine's hook does not run: the read translates itself.
    # No ping on checkout however slow the host: the first read meets the dead connection.
    monkeypatch.setattr(engine_module, "PING_AFTER_IDLE_S", 3600.0)
    with relayed(postgres_url) as (url, relay):
        engine = make_engine(url)
        try:
            one = OneStatementRead(engine, select(func.count()).select_from(runs))
            assert one.rows({})[0][0] >= 0
            relay.cut()
            with pytest.raises(DatabaseUnreachable) as mid_query:  # it died under the read
                one.rows({})
            assert type(mid_query.value.__cause__) is psycopg.OperationalError
            with pytest.raises(DatabaseUnreachable) as connecting:  # a new one is refused
                one.rows({})
            assert type(connecting.value.__cause__) is psycopg.OperationalError
            # The dead one was dropped, not rolled back on its way to the pool (an ERROR line
            # quoting the driver).
            assert not [r for r in caplog.records if r.levelname == "ERROR"]
            relay.resume()
            assert one.rows({})[0][0] >= 0  # the pool connects afresh
        finally:
            engine.dispose()


def test_a_one_statement_read_of_a_database_never_migrated_is_not_migrated(
    tmp_path: Path,
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    try:
        with pytest.raises(NotMigrated):
            OneStatementRead(engine, select(func.count()).select_from(runs)).rows({})
    finally:
        engine.dispose()
