"""PostgreSQL reads on the event loop (app/storage/async_reads.py), against a real server:
the same answer as the sync read, a cut connection replaced, at most ``size`` connections,
a read cancelled mid-query never hands its connection to the next, and ``aclose``."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, create_engine, text

from app.domain.errors import NotFound
from app.domain.ids import uuid7
from app.storage.async_reads import AsyncReads
from app.storage.engine import make_engine
from app.storage.run_reads import RunReader
from tests.storage.helpers import define_task, enqueue

pytestmark = pytest.mark.postgres
DEADLINE_S = 10.0


@pytest.fixture
def pg(postgres_url: str) -> Iterator[tuple[Engine, Engine]]:
    """The service's engine and an autocommit admin engine on the same schema."""
    engine = make_engine(postgres_url)
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    try:
        yield engine, admin
    finally:
        admin.dispose()
        engine.dispose()


def _name() -> str:
    return f"ql-test-{uuid.uuid4().hex[:12]}"  # this test's connections, in pg_stat_activity


def _backends(admin: Engine, name: str, state: str | None = None) -> list[int]:
    query = "SELECT pid FROM pg_stat_activity WHERE application_name = :n"
    query += " AND state = :s" if state else ""
    with admin.connect() as conn:
        return list(conn.execute(text(query), {"n": name, "s": state}).scalars())


async def _until(admin: Engine, name: str, count: int, state: str | None = None) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while len(await asyncio.to_thread(_backends, admin, name, state)) != count:
        assert loop.time() < deadline, f"never {count} backends of {name} ({state})"
        await asyncio.sleep(0.02)


def test_the_event_loop_read_is_the_sync_read(pg: tuple[Engine, Engine]) -> None:
    engine, _admin = pg
    define_task(engine, task="async")
    run = enqueue(engine, task="async")
    reads = AsyncReads(engine)
    reader = RunReader(engine, async_reads=reads)

    async def go() -> None:
        try:
            assert await reader.get_run_async(run.id) == RunReader(engine).get_run(run.id)
            with pytest.raises(NotFound):
                await reader.get_run_async(uuid7())
        finally:
            await reads.aclose()

    asyncio.run(go())


def test_a_connection_the_server_cut_is_replaced_and_the_read_answers(
    pg: tuple[Engine, Engine],
) -> None:
    engine, admin = pg
    define_task(engine, task="async")
    run = enqueue(engine, task="async")
    name = _name()
    reads = AsyncReads(engine, application_name=name)
    reader = RunReader(engine, async_reads=reads)

    async def go() -> None:
        try:
            await reader.get_run_async(run.id)
            (first,) = _backends(admin, name)
            with admin.connect() as conn:
                conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": first})
            await _until(admin, name, 0)
            assert (await reader.get_run_async(run.id)).id == run.id
            assert _backends(admin, name) not in ([], [first])
        finally:
            await reads.aclose()
        await _until(admin, name, 0)  # aclose closed the idle connection

    asyncio.run(go())


def test_at_most_size_connections_and_a_cancelled_read_never_hands_its_connection_on(
    pg: tuple[Engine, Engine],
) -> None:
    engine, admin = pg
    define_task(engine, task="async")
    run = enqueue(engine, task="async")
    name = _name()
    reads = AsyncReads(engine, size=2, application_name=name)
    reader = RunReader(engine, async_reads=reads)
    locker: Connection = engine.connect()

    async def go() -> None:
        try:
            locker.execute(text("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE"))  # reads now wait
            waiting = [asyncio.create_task(reader.get_run_async(run.id)) for _ in range(6)]
            await _until(admin, name, 2, state="active")  # two in the server, four on the loop
            await asyncio.sleep(0.1)
            assert len(_backends(admin, name)) == 2
            for task in waiting:
                task.cancel()
            results = await asyncio.gather(*waiting, return_exceptions=True)
            assert all(isinstance(r, asyncio.CancelledError) for r in results)
            locker.rollback()  # the lock goes; the two cut-off queries end with their clients
            await _until(admin, name, 0)
            assert (await reader.get_run_async(run.id)).id == run.id  # on a fresh connection
            assert len(_backends(admin, name)) == 1
        finally:
            locker.close()
            await reads.aclose()

    asyncio.run(go())
