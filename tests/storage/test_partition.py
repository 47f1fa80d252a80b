"""A PostgreSQL connection whose packets vanish fails within a bound, never hangs for TCP.

A real partition built from a network namespace and a blackhole route (tests/kit/partition.py):
no reset, no refusal, nothing acknowledged. Without the keepalive and user-timeout defaults
(app/storage/engine.py) a statement on such a connection waits for TCP's own retries, a
quarter of an hour; the control case below shows it still waiting. The bounds are shortened
to a second here so the tests are quick; the defaults only scale them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import Engine, literal, select, text

from app.domain.errors import DatabaseUnreachable
from app.storage import engine as engine_module
from app.storage.async_reads import AsyncReads
from app.storage.engine import make_engine, pg_session_options
from app.storage.one_statement import OneStatementRead
from tests.kit.partition import Partition, partitioned, shorten_bounds, vanished_session

pytestmark = pytest.mark.postgres

BOUND_S = 4.0  # a one-second user timeout, plus the kernel's timer and a slow host


@pytest.fixture
def short_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    shorten_bounds(monkeypatch)
    # No ping at checkout, however slow the host: the statement itself meets the partition.
    monkeypatch.setattr(engine_module, "PING_AFTER_IDLE_S", 3600.0)


@pytest.fixture
def through_partition(postgres_url: str) -> Iterator[tuple[str, Partition]]:
    with partitioned(postgres_url) as (url, partition):
        yield url, partition


def _one(engine: Engine, sql: str = "select 1") -> object:
    with engine.connect() as conn:
        return conn.execute(text(sql)).scalar_one()


def test_a_statement_sent_into_a_partition_fails_unreachable_within_the_user_timeout(
    short_bounds: None, through_partition: tuple[str, Partition]
) -> None:
    url, partition = through_partition
    engine = make_engine(url)
    try:
        assert _one(engine) == 1  # the pooled connection is made before the partition
        partition.drop()
        started = time.monotonic()
        with pytest.raises(DatabaseUnreachable) as lost:
            _one(engine)  # sent, never acknowledged
        assert time.monotonic() - started < BOUND_S
        assert isinstance(lost.value.__cause__, psycopg.OperationalError)
        started = time.monotonic()
        with pytest.raises(DatabaseUnreachable):
            _one(engine)  # the dead one was dropped; a new one cannot connect
        assert time.monotonic() - started < BOUND_S
        partition.heal()
        assert _one(engine) == 1  # connects afresh, no restart
    finally:
        engine.dispose()


def test_an_answer_lost_while_the_server_works_fails_within_the_bound_and_a_long_one_is_not_cut(
    short_bounds: None, through_partition: tuple[str, Partition]
) -> None:
    url, partition = through_partition
    engine = make_engine(url)
    try:
        # A statement longer than every bound: the server's kernel answers the probes.
        assert _one(engine, "select pg_sleep(2.5)::text") == ""
        dropper = threading.Timer(0.3, partition.drop)  # the statement was acknowledged
        dropper.start()
        started = time.monotonic()
        with pytest.raises(DatabaseUnreachable):
            _one(engine, "select pg_sleep(8)::text")  # longer than the bound
        dropper.join()
        assert time.monotonic() - started < 0.3 + BOUND_S
    finally:
        engine.dispose()


def test_without_the_bounds_a_statement_in_a_partition_waits_until_it_heals(
    short_bounds: None, through_partition: tuple[str, Partition]
) -> None:
    # The control: the URL turns the keepalives and the user timeout off (its own parameters
    # win over the defaults), and the same statement hangs as long as the partition lasts.
    url, partition = through_partition
    engine = make_engine(f"{url}{'&' if '?' in url else '?'}keepalives=0&tcp_user_timeout=0")
    try:
        assert _one(engine) == 1
        partition.drop()
        outcome: list[object] = []
        reader = threading.Thread(target=lambda: outcome.append(_one(engine)), daemon=True)
        reader.start()
        reader.join(2.5)  # more than twice the bound the defaults give
        assert reader.is_alive() and not outcome
        partition.heal()
        reader.join(30)  # TCP's next retransmission, a few seconds of backoff away
        assert outcome == [1]
    finally:
        engine.dispose()


def test_the_event_loop_reads_fail_unreachable_within_the_bound(
    short_bounds: None, through_partition: tuple[str, Partition]
) -> None:
    url, partition = through_partition
    engine = make_engine(url)
    try:
        one = OneStatementRead(engine, select(literal(1)))

        async def scenario() -> float:
            reads = AsyncReads(engine)
            try:
                assert await reads.rows(one, {}) == [(1,)]
                partition.drop()
                started = time.monotonic()
                with pytest.raises(DatabaseUnreachable):
                    # the idle connection breaks, the one retry cannot connect
                    await reads.rows(one, {})
                elapsed = time.monotonic() - started
                partition.heal()
                assert await reads.rows(one, {}) == [(1,)]
                return elapsed
            finally:
                await reads.aclose()

        assert asyncio.run(scenario()) < BOUND_S + 2  # the user timeout, then the connect's
    finally:
        engine.dispose()


_SERVER_SIDE = "SELECT current_setting('tcp_keepalives_idle')"


def _parameters(engine: Engine) -> list[dict[str, str]]:
    """The libpq parameters of a new sync connection and of a new event-loop one, and the
    server's keepalive idle time of its session (``server_idle``)."""
    with engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        sync = {
            **raw.info.get_parameters(),
            "server_idle": conn.execute(text(_SERVER_SIDE)).scalar_one(),
        }

    async def on_loop() -> dict[str, str]:
        reads = AsyncReads(engine)
        try:
            conn = await reads._connect()
            try:
                cursor = await conn.execute(_SERVER_SIDE)
                row = await cursor.fetchone()
                assert row is not None
                return {**conn.info.get_parameters(), "server_idle": row[0]}
            finally:
                await conn.close()
        finally:
            await reads.aclose()

    return [sync, asyncio.run(on_loop())]


def test_every_connection_gets_the_bounds_unless_its_url_sets_its_own(postgres_url: str) -> None:
    url = f"{postgres_url}{'&' if '?' in postgres_url else '?'}tcp_user_timeout=0"
    for engine_url, expected in ((postgres_url, "10000"), (url, "0")):
        engine = make_engine(engine_url)
        try:
            for params in _parameters(engine):
                assert params["tcp_user_timeout"] == expected
                assert params["keepalives_idle"] == "5"
                assert params["connect_timeout"] == "5"
                assert params["server_idle"] == "5"
        finally:
            engine.dispose()


def _sessions_named(engine: Engine, name: str) -> list[int]:
    with engine.connect() as conn:
        query = text("SELECT pid FROM pg_stat_activity WHERE application_name = :name")
        return list(conn.execute(query, {"name": name}).scalars())


def test_the_server_drops_the_session_of_a_client_that_vanished_without_a_word(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A client host that lost power keeps its server process and connection slot for the
    # server's default two hours; with our session options, until the server's first
    # keepalive probe finds the connection gone (its peer answers the probe with a reset).
    shorten_bounds(monkeypatch)
    ours = vanished_session(postgres_url, pg_session_options(None))
    without = vanished_session(postgres_url, "")  # the control: the server's defaults
    engine = make_engine(postgres_url)
    try:
        deadline = time.monotonic() + BOUND_S
        while _sessions_named(engine, ours) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _sessions_named(engine, ours) == []
        assert len(_sessions_named(engine, without)) == 1  # held, and would be for hours
    finally:
        with engine.connect() as conn:  # the test leaves no server process behind
            for pid in _sessions_named(engine, without) + _sessions_named(engine, ours):
                conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        engine.dispose()
