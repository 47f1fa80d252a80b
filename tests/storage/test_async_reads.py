"""PostgreSQL reads on the event loop (app/storage/async_reads.py), against a real server:
the same answer as the sync read, a cut connection replaced, at most ``size`` connections,
a read cancelled mid-query never hands its connection to the next, and ``aclose``."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Connection, Engine, create_engine, make_url, text

from app.context.bootstrap import build_context
from app.domain.errors import NotFound
from app.domain.ids import uuid7
from app.domain.model import Run
from app.domain.profiles import EDGE
from app.settings import Settings
from app.storage import async_reads
from app.storage.async_reads import AsyncReads
from app.storage.engine import make_engine
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from tests.storage.helpers import define_task, enqueue, start

DEADLINE_S = 10.0


@dataclass
class Pg:
    """The service's engine, an autocommit admin engine on the same schema, one queued run,
    and a name that tells this test's read connections apart in ``pg_stat_activity``."""

    engine: Engine
    admin: Engine
    run_id: str
    url: str
    name: str = field(default_factory=lambda: f"ql-test-{uuid.uuid4().hex[:12]}")

    def url_with(self, option: str) -> str:
        """This database's URL with one more server option (``-c name=value``)."""
        url = make_url(self.url)
        options = f"{url.query.get('options', '')} {option}".strip()
        return url.update_query_dict({"options": options}).render_as_string(hide_password=False)

    def reader(self, *, size: int = 5) -> tuple[AsyncReads, RunReader]:
        reads = AsyncReads(self.engine, size=size, application_name=self.name)
        return reads, RunReader(self.engine, async_reads=reads)

    def backends(self, state: str | None = None) -> list[int]:
        query = "SELECT pid FROM pg_stat_activity WHERE application_name = :n"
        query += " AND state = :s" if state else ""
        with self.admin.connect() as conn:
            return list(conn.execute(text(query), {"n": self.name, "s": state}).scalars())

    async def until(self, count: int, state: str | None = None) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        while len(await asyncio.to_thread(self.backends, state)) != count:
            assert loop.time() < deadline, f"never {count} backends of {self.name} ({state})"
            await asyncio.sleep(0.02)


@pytest.fixture
def pg(postgres_url: str) -> Iterator[Pg]:
    engine = make_engine(postgres_url)
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    try:
        define_task(engine, task="async")
        yield Pg(engine, admin, enqueue(engine, task="async").id, postgres_url)
    finally:
        admin.dispose()
        engine.dispose()


@pytest.mark.postgres
def test_the_event_loop_read_is_the_sync_read(pg: Pg) -> None:
    cancelled = enqueue(pg.engine, task="async").id
    RunRepository(pg.engine).request_cancel(run_id=cancelled, reason="user")
    running = start(pg.engine, enqueue(pg.engine, task="async")).id
    reads, reader = pg.reader()

    async def go() -> None:
        try:
            for run_id in (pg.run_id, cancelled, running):
                assert await reader.get_run_async(run_id) == RunReader(pg.engine).get_run(run_id)
            with pytest.raises(NotFound):
                await reader.get_run_async(uuid7())
        finally:
            await reads.aclose()

    asyncio.run(go())


@pytest.mark.postgres
def test_a_second_event_loop_reads_through_the_sync_path(pg: Pg) -> None:
    reads, reader = pg.reader(size=1)

    async def three_at_once() -> list[str]:
        runs = await asyncio.gather(*(reader.get_run_async(pg.run_id) for _ in range(3)))
        return [run.id for run in runs]

    assert asyncio.run(three_at_once()) == [pg.run_id] * 3  # binds the pool to this loop
    assert asyncio.run(three_at_once()) == [pg.run_id] * 3  # another loop: no pool, no error
    assert len(pg.backends()) == 1

    async def close() -> None:
        await reads.aclose()
        await pg.until(0)

    asyncio.run(close())


@pytest.mark.postgres
def test_only_a_broken_connection_is_retried(pg: Pg, monkeypatch: pytest.MonkeyPatch) -> None:
    # A lock timeout is the caller's answer, not a cut connection: one try, not two.
    reads = AsyncReads(make_engine(pg.url_with("-c lock_timeout=100")), application_name=pg.name)
    reader = RunReader(pg.engine, async_reads=reads)
    tries: list[str] = []
    execute = async_reads._rows_on

    async def counting(conn: Any, sql: str, args: Any) -> list[tuple[Any, ...]]:
        tries.append(sql)
        return await execute(conn, sql, args)

    monkeypatch.setattr(async_reads, "_rows_on", counting)
    locker: Connection = pg.engine.connect()

    async def go() -> None:
        try:
            await reader.get_run_async(pg.run_id)  # the next read reuses this connection
            locker.execute(text("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE"))
            with pytest.raises(psycopg.errors.LockNotAvailable):
                await reader.get_run_async(pg.run_id)
            assert len(tries) == 2
        finally:
            locker.close()
            await reads.aclose()

    asyncio.run(go())


def test_a_reader_without_event_loop_connections_reads_in_a_thread(engine: Engine) -> None:
    define_task(engine, task="async")
    run_id = enqueue(engine, task="async").id
    reader = RunReader(engine)
    threads: list[int] = []
    get_run = reader.get_run

    def recording(run_id: str) -> Run:
        threads.append(threading.get_ident())
        return get_run(run_id)

    reader.get_run = recording  # type: ignore[method-assign]
    assert asyncio.run(reader.get_run_async(run_id)) == get_run(run_id)
    assert threads and threads[0] != threading.get_ident()


@pytest.mark.postgres
def test_a_connection_the_server_cut_is_replaced_and_the_read_answers(pg: Pg) -> None:
    reads, reader = pg.reader()

    async def go() -> None:
        try:
            await reader.get_run_async(pg.run_id)
            (first,) = pg.backends()
            with pg.admin.connect() as conn:
                conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": first})
            await pg.until(0)
            assert (await reader.get_run_async(pg.run_id)).id == pg.run_id
            assert pg.backends() not in ([], [first])
        finally:
            await reads.aclose()
        await pg.until(0)  # aclose closed the idle connection

    asyncio.run(go())


@pytest.mark.postgres
def test_at_most_size_connections_and_a_cancelled_read_never_hands_its_connection_on(
    pg: Pg,
) -> None:
    reads, reader = pg.reader(size=2)
    locker: Connection = pg.engine.connect()

    async def go() -> None:
        try:
            locker.execute(text("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE"))  # reads now wait
            waiting = [asyncio.create_task(reader.get_run_async(pg.run_id)) for _ in range(6)]
            await pg.until(2, state="active")  # two in the server, four on the loop
            await asyncio.sleep(0.1)
            assert len(pg.backends()) == 2
            for task in waiting:
                task.cancel()
            results = await asyncio.gather(*waiting, return_exceptions=True)
            assert all(isinstance(r, asyncio.CancelledError) for r in results)
            locker.rollback()  # the lock goes; the two cut-off queries end with their clients
            await pg.until(0)
            assert (await reader.get_run_async(pg.run_id)).id == pg.run_id  # a fresh connection
            assert len(pg.backends()) == 1
        finally:
            locker.close()
            await reads.aclose()

    asyncio.run(go())


def test_the_api_context_reads_runs_on_the_loop_on_postgresql_only(
    db_url: str, tmp_path: Path
) -> None:
    ctx = build_context(Settings(data_dir=tmp_path, database_url=db_url, profile=EDGE),
                        execution=False)  # fmt: skip
    try:
        assert (ctx.async_reads is not None) == db_url.startswith("postgresql+psycopg")
        assert ctx.facade.reads_inline == db_url.startswith("sqlite")
    finally:
        asyncio.run(ctx.aclose())
