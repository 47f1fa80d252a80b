"""Reads that are one SELECT, compiled once per engine and run on a pooled DBAPI connection.

One statement is answered from one snapshot on both engines (SQLite's implicit read
transaction in autocommit mode, PostgreSQL's statement snapshot under READ COMMITTED), so
such a read needs no BEGIN/ROLLBACK of its own. Going below ``Connection.execute`` also skips
the per-call cache-key walk of a wide joined select and the connection events, which cost
the hot API read (GET one run) most of its database time (figures: bench/README.md).

Only for reads whose statement shape is fixed at import time; the parameters are bound by the
driver, never formatted into the SQL.

Below ``Connection.execute`` the engine's error hook does not run, so ``rows`` translates the
driver's errors itself, as that hook does (app/storage/engine.py): a missing table is
NotMigrated, a lost or refused connection DatabaseUnreachable, SQLite's lock DatabaseBusy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine, Select

from app.storage.engine import domain_error


class OneStatementRead:
    """A SELECT compiled for ``engine``'s dialect; ``rows(params)`` returns plain tuples."""

    __slots__ = ("_autocommit", "_defaults", "_engine", "_order", "_sql")

    def __init__(self, engine: Engine, statement: Select[Any]) -> None:
        compiled = statement.compile(dialect=engine.dialect)
        self._engine = engine
        self._sql = compiled.string
        self._defaults = dict(compiled.params)  # binds the dialect added (SQLite's OFFSET 0)
        # qmark (SQLite) binds by position, pyformat (psycopg) by name.
        self._order = tuple(compiled.positiontup or ()) if compiled.positional else None
        # psycopg opens a transaction for a SELECT, and the pool then pays a ROLLBACK round
        # trip when the connection comes back; SQLite connections are in autocommit already.
        self._autocommit = engine.dialect.name == "postgresql"

    def bound(self, params: Mapping[str, Any]) -> tuple[str, Any]:
        """The SQL and the driver's arguments for ``params`` (also for app.storage.async_reads)."""
        values = {**self._defaults, **params}
        return self._sql, values if self._order is None else tuple(values[n] for n in self._order)

    def rows(self, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Every row of the statement with ``params`` bound."""
        sql, args = self.bound(params)
        try:
            raw = self._engine.raw_connection()  # returned to the pool (and reset) on close
        except Exception as exc:
            _raise_translated(exc, connecting=True, broken=False)
            raise
        driver: Any = raw.dbapi_connection
        try:
            if self._autocommit:
                driver.autocommit = True
            cursor = raw.cursor()
            try:
                cursor.execute(sql, args)
                return list(cursor.fetchall())
            finally:
                cursor.close()
                if self._autocommit and not driver.closed:
                    driver.autocommit = False
        except Exception as exc:
            # psycopg marks a connection that died under it: dropped here, as the engine's hook
            # drops one, and not rolled back on its way to the pool (which would log the
            # driver's error).
            broken = bool(getattr(driver, "broken", False) or getattr(driver, "closed", False))
            if broken:
                raw.invalidate(exc)
            _raise_translated(exc, connecting=False, broken=broken)
            raise
        finally:
            raw.close()


def _raise_translated(exc: Exception, *, connecting: bool, broken: bool) -> None:
    """Raise the domain's error for a driver error the engine's hook would translate."""
    error = domain_error(exc, connecting=connecting, disconnect=broken)
    if error is not None:
        raise error from exc
