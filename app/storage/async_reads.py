"""PostgreSQL reads on the event loop: a few autocommit psycopg ``AsyncConnection``s.

GET one run is what clients poll. Through the sync engine a PostgreSQL read costs a
worker-thread round trip plus the sync pool's and driver's work in the api process; on the
event loop, over connections kept in autocommit, about half of that (figures:
bench/README.md).

One pool per api context, bound to the first event loop that reads through it (a connection
belongs to the loop that opened it); a read from any other loop takes the sync path in a
thread. Connections open on first use, at most ``size`` at once; a caller waits on the loop
for a free one. A connection that fails, or whose caller was cancelled mid-query, is closed
and never reused; a read that found its idle connection broken (a server restart, an idle
cut) is retried once on a fresh one, since a SELECT can be repeated; any other error is the
caller's, except a connection that could not be opened or broke: DatabaseUnreachable, as
the sync engine says it (engine.py). ``aclose`` (the api lifespan's shutdown) closes the
idle ones. A cancelled read's server process lingers until it notices its client left, so
the server may briefly count more than ``size``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import psycopg
from sqlalchemy import Engine

from app.domain.errors import DatabaseUnreachable
from app.storage.engine import domain_error, pg_connection_defaults, pg_session_options
from app.storage.one_statement import OneStatementRead

APPLICATION_NAME = "qinglong-api-reads"  # how an operator tells these apart in pg_stat_activity


class AsyncReads:
    """Runs a ``OneStatementRead`` on the event loop over at most ``size`` connections."""

    def __init__(
        self, engine: Engine, *, size: int = 5, application_name: str = APPLICATION_NAME
    ) -> None:
        cargs, cparams = engine.dialect.create_connect_args(engine.url)
        self._args: Sequence[Any] = cargs
        # The dialect's own adapters context comes along, so values decode as on the sync path.
        # The sync engine's connect and keepalive defaults, unless the URL sets its own.
        self._params: dict[str, Any] = {
            **pg_connection_defaults(),
            **cparams,
            "options": pg_session_options(cparams.get("options")),
            "autocommit": True,  # one statement, one snapshot: no BEGIN/ROLLBACK round trips
            "application_name": application_name,
        }
        self._slots = asyncio.Semaphore(size)
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    async def rows(self, read: OneStatementRead, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Every row of ``read`` with ``params`` bound, as ``read.rows`` would return them."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop  # the connections and the semaphore belong to this loop
        elif loop is not self._loop:
            # A context served from a second loop reads as the sync path does, in a thread.
            return await asyncio.to_thread(read.rows, params)
        sql, args = read.bound(params)
        async with self._slots:
            conn, reused = await self._take()
            try:
                rows = await _rows_on(conn, sql, args)
            except DatabaseUnreachable:
                if not reused:
                    raise
                conn = await self._connect()  # the idle one was cut: once more, fresh
                rows = await _rows_on(conn, sql, args)
            if self._closed:
                await _discard(conn)
            else:
                self._idle.append(conn)
            return rows

    async def aclose(self) -> None:
        """Close the idle connections; one in use now is closed when its read ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await _discard(conn)

    async def _take(self) -> tuple[psycopg.AsyncConnection[Any], bool]:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn, True
        return await self._connect(), False

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        try:
            return await psycopg.AsyncConnection.connect(*self._args, **self._params)
        except psycopg.OperationalError as exc:
            error = domain_error(exc, connecting=True, disconnect=False)
            if error is None:
                raise  # not a failed connect at all (none is known today): as it came
            raise error from exc


async def _rows_on(
    conn: psycopg.AsyncConnection[Any], sql: str, args: Any
) -> list[tuple[Any, ...]]:
    """The statement's rows on ``conn``. On any error (cancelled mid-query, or worse) the
    connection is closed, never reused, and the error translated as the sync engine does
    (engine.py): one that broke is DatabaseUnreachable, not a timeout or a lock error."""
    try:
        cursor = await conn.execute(sql, args)
        return list(await cursor.fetchall())
    except BaseException as exc:
        broken = conn.broken or conn.closed  # before closing it makes every one closed
        await _discard(conn)
        if isinstance(exc, Exception):
            error = domain_error(exc, connecting=False, disconnect=broken)
            if error is not None:
                raise error from exc
        raise


async def _discard(conn: psycopg.AsyncConnection[Any]) -> None:
    with contextlib.suppress(Exception):  # already broken: closing is all that is left to do
        await conn.close()
