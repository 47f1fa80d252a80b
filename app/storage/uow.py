"""Unit of work over one Connection: ``with uow: ...; uow.commit()``, rolled back otherwise."""

from __future__ import annotations

from types import TracebackType

from sqlalchemy import Connection, Engine

from app.storage.engine import WRITE


class UnitOfWork:
    """One transaction. Leaving the block without ``commit()`` rolls it back."""

    def __init__(self, engine: Engine, *, write: bool = True) -> None:
        self._engine = engine
        self._write = write
        self._conn: Connection | None = None
        self._committed = False

    @property
    def conn(self) -> Connection:
        """The connection of the open transaction."""
        if self._conn is None:
            raise RuntimeError("unit of work is not open")
        return self._conn

    def __enter__(self) -> UnitOfWork:
        conn = self._engine.connect()
        if self._write:
            conn = conn.execution_options(**{WRITE: True})
        conn.begin()
        self._conn = conn
        self._committed = False
        return self

    def commit(self) -> None:
        """Commit the transaction; the block may not write afterwards."""
        self.conn.commit()
        self._committed = True

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
                conn.rollback()
        finally:
            conn.close()
