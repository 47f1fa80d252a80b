"""Which driver errors mean "the store cannot take writes now" rather than a bug.

SQLite reports a full disk as SQLITE_FULL ("database or disk is full"), a read-only file or
file system as SQLITE_READONLY, and a failed write of its WAL or journal as SQLITE_IOERR;
extended codes carry the primary code in their low byte. SQLITE_CANTOPEN is left out: it
means a missing or misconfigured path far more often than a full disk. PostgreSQL reports
SQLSTATE class 53 (insufficient resources: 53100 disk_full), 25006 (read-only transaction:
a standby, or default_transaction_read_only) and 58030 (io_error).

``WRITE_HEALTH`` remembers, per engine, whether this process's newest write was refused:
readiness reports it (a disk can be full for the database long before free space says so,
e.g. a PostgreSQL server on another volume).
"""

from __future__ import annotations

import sqlite3
import time
import weakref

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

_SQLITE_CODES = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_IOERR})
_PG_STATES = frozenset({"25006", "58030"})


def is_storage_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` (SQLAlchemy-wrapped or raw driver error) is one of those refusals."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    if isinstance(orig, sqlite3.Error):
        code = getattr(orig, "sqlite_errorcode", None)
        return isinstance(code, int) and code & 0xFF in _SQLITE_CODES
    state = getattr(orig, "sqlstate", None)  # psycopg.Error, without importing psycopg here
    return isinstance(state, str) and (state.startswith("53") or state in _PG_STATES)


class _WriteHealth:
    """Per engine: did the newest write transaction of this process fail to commit?"""

    def __init__(self) -> None:
        self._refused_at: weakref.WeakKeyDictionary[Engine, float] = weakref.WeakKeyDictionary()

    def refused(self, engine: Engine) -> None:
        self._refused_at[engine] = time.monotonic()

    def committed(self, engine: Engine) -> None:
        if self._refused_at:  # the common case costs one truth test per commit
            self._refused_at.pop(engine, None)

    def refusing(self, engine: Engine) -> bool:
        """True while the newest write was refused, for at most REFUSAL_MEMORY_S.

        Passive on purpose: a probe that commits would cost a write per /readyz and, on
        PostgreSQL, can succeed in a page with room while inserts need new pages. A
        successful write clears it at once; without writes it is forgotten after the
        memory (the next refused write says it again).
        """
        at = self._refused_at.get(engine)
        return at is not None and time.monotonic() - at < REFUSAL_MEMORY_S


REFUSAL_MEMORY_S = 10.0  # as long as the Retry-After the refused client was told
WRITE_HEALTH = _WriteHealth()
