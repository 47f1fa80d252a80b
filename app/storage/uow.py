"""Unit of work over one Connection: ``with uow: ...; uow.commit()``, rolled back otherwise.

Every repository transaction goes through here, so this is the one place where a database
that cannot take writes (disk full, read-only; app.storage.unavailable) becomes
StorageUnavailable, which the api answers with 503 (app/api/problems.py).
"""

from __future__ import annotations

import threading
import weakref
from types import TracebackType

from sqlalchemy import Connection, Engine

from app.domain.errors import StorageUnavailable
from app.storage.engine import WRITE
from app.storage.unavailable import WRITE_HEALTH, is_storage_unavailable

# SQLite has one writer at a time, and a writer that finds the lock taken sleeps in SQLite's
# busy handler (1, 2, 5, 10... ms) instead of waking when it is free. Threads of one process
# therefore queue for it here, on a lock that hands over at once; other processes still
# meet the busy timeout. Profiled in bench/profile_dispatch.py (BEGIN IMMEDIATE waits).
_SQLITE_WRITERS: weakref.WeakKeyDictionary[Engine, threading.RLock] = weakref.WeakKeyDictionary()
_GATES_LOCK = threading.Lock()


def _writer_gate(engine: Engine) -> threading.RLock | None:
    """The in-process writer lock of a SQLite engine; None for PostgreSQL (row locks)."""
    if engine.dialect.name != "sqlite":
        return None
    with _GATES_LOCK:
        gate = _SQLITE_WRITERS.get(engine)
        if gate is None:
            gate = _SQLITE_WRITERS[engine] = threading.RLock()
        return gate


class UnitOfWork:
    """One transaction. Leaving the block without ``commit()`` rolls it back."""

    def __init__(self, engine: Engine, *, write: bool = True) -> None:
        self._engine = engine
        self._write = write
        self._conn: Connection | None = None
        self._committed = False
        self._gate = _writer_gate(engine) if write else None
        # A read that ended without error commits on PostgreSQL: psycopg drops every
        # prepared statement of the connection on ROLLBACK (and sends DEALLOCATE ALL), so
        # rolled-back reads kept the hot statements from ever being prepared: each was
        # parsed and planned again (~0.7 ms for the dispatch page). A read-only
        # transaction's COMMIT writes nothing.
        self._end_read_by_commit = not write and engine.dialect.name == "postgresql"

    @property
    def conn(self) -> Connection:
        """The connection of the open transaction."""
        if self._conn is None:
            raise RuntimeError("unit of work is not open")
        return self._conn

    def __enter__(self) -> UnitOfWork:
        if self._gate is not None:
            self._gate.acquire()
        try:
            conn = self._engine.connect()
            if self._write:
                conn = conn.execution_options(**{WRITE: True})
            try:
                conn.begin()
            except BaseException:
                conn.close()
                raise
        except BaseException as exc:
            if self._gate is not None:
                self._gate.release()
            if is_storage_unavailable(exc):
                WRITE_HEALTH.refused(self._engine)
                raise StorageUnavailable() from exc
            raise
        self._conn = conn
        self._committed = False
        return self

    def commit(self) -> None:
        """Commit the transaction; the block may not write afterwards."""
        self.conn.commit()
        self._committed = True
        if self._write:
            WRITE_HEALTH.committed(self._engine)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if not self._committed:
                if exc is None and self._end_read_by_commit:
                    conn.commit()
                else:
                    conn.rollback()
        finally:
            try:
                conn.close()
            finally:
                if self._gate is not None:
                    self._gate.release()
        if exc is not None and is_storage_unavailable(exc):
            WRITE_HEALTH.refused(self._engine)
            raise StorageUnavailable() from exc
