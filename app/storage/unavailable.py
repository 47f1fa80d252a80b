"""Which driver errors mean "the store cannot take writes now" rather than a bug.

SQLite reports a full disk as SQLITE_FULL ("database or disk is full"), a read-only file or
file system as SQLITE_READONLY, and a failed write of its WAL or journal as SQLITE_IOERR;
extended codes carry the primary code in their low byte. SQLITE_CANTOPEN is left out: it
means a missing or misconfigured path far more often than a full disk; a start tells the two
apart by the database's directory (``cannot_open_for_room``: no inode left to make the
``-wal``, no block, or a read-only mount). PostgreSQL reports
SQLSTATE class 53 (insufficient resources: 53100 disk_full), 25006 (read-only transaction:
a standby, or default_transaction_read_only) and 58030 (io_error).

``outage_of`` names the other two ways a database fails a request for a while: a lost or
refused connection (``DatabaseUnreachable``) and SQLite's write lock held by another process
past the busy timeout (``DatabaseBusy``); the engine raises them in the driver's error's
place (app/storage/engine.py), so the api answers 503 with Retry-After, not 500.

``WRITE_HEALTH`` remembers, per engine, whether this process's newest write was refused:
readiness reports it (a disk can be full for the database long before free space says so,
e.g. a PostgreSQL server on another volume).
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
import weakref
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from app.domain.errors import DatabaseBusy, DatabaseUnreachable, StorageUnavailable

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


def cannot_open_for_room(exc: BaseException, database: Path) -> bool:
    """True when ``exc`` is SQLite's SQLITE_CANTOPEN and the directory of ``database`` has no
    inode or no block left, or is mounted read-only: SQLite could not make its ``-wal`` or
    ``-shm`` there, and freeing space, not the URL, is the cure."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    code = getattr(orig, "sqlite_errorcode", None) if isinstance(orig, sqlite3.Error) else None
    if not isinstance(code, int) or code & 0xFF != sqlite3.SQLITE_CANTOPEN:
        return False
    try:
        st = os.statvfs(database.parent)
    except OSError:
        return False  # a missing directory: the path is wrong, not the disk full
    # btrfs and vfat report no inode count at all (f_files 0): only a count that ran out says so.
    no_inode = st.f_files > 0 and st.f_favail == 0
    return no_inode or st.f_bavail == 0 or bool(st.f_flag & os.ST_RDONLY)


# The connection exceptions of class 08 (not 08P01, a protocol violation: a bug), the server
# shutting down or crashed (57P01, 57P02), starting up or shutting down when asked to
# connect (57P03), and ending a session left idle in a transaction (25P03,
# app/storage/engine.py).
_PG_CONNECTION_STATES = frozenset(
    {"08000", "08001", "08003", "08004", "08006", "08007", "57P01", "57P02", "57P03", "25P03"}
)


def outage_of(
    orig: BaseException, *, connecting: bool, disconnect: bool
) -> StorageUnavailable | None:
    """The outage a raw driver error means, or None for any other error.

    ``connecting``: it was raised while a connection was being opened; ``disconnect``: the
    dialect found the connection dead (psycopg: broken or closed). psycopg gives a failed
    connect no SQLSTATE, whether nothing answered or the server refused the login (a wrong
    password, an unknown database) or the connect timed out: all are unreachable here, and
    the CLI's one line at start-up says to check QL_DATABASE_URL.
    """
    if isinstance(orig, sqlite3.Error):
        code = getattr(orig, "sqlite_errorcode", None)
        busy = isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_BUSY
        return DatabaseBusy() if busy else None
    state = getattr(orig, "sqlstate", None)  # psycopg.Error, without importing psycopg here
    if disconnect or state in _PG_CONNECTION_STATES:
        return DatabaseUnreachable()
    # psycopg's OperationalError or a subclass of it (ConnectionTimeout: nothing answered
    # within the connect timeout), named rather than imported: SQLite's engine loads no psycopg.
    operational = any(c.__name__ == "OperationalError" for c in type(orig).__mro__)
    if connecting and state is None and operational:
        return DatabaseUnreachable()
    return None


_QUOTED = re.compile(r"\"[^\"]*\"|'[^']*'")


def connect_failure_reason(exc: BaseException) -> str | None:
    """What the driver said when a connection failed, for an operator's one line, or None.

    libpq's words after "connection to server at ... failed:", without the host: "Connection
    refused", ``FATAL:  password authentication failed for user "app"``, ``FATAL:  database
    "x" does not exist``, "server closed the connection unexpectedly". A refused login and a
    server that is down are both DATABASE_UNREACHABLE (psycopg gives neither a SQLSTATE),
    and only these words tell the operator which. Only the first line, printable characters,
    at most 200 of them. The server's own ``FATAL:`` line names a role or a database, never
    the password. Anything else loses what it quotes: a host name may hold a fragment of a
    password when the URL's ``@`` was not escaped (``app:p@ss@db`` makes the host
    ``ss@db``), so a name that did not resolve is said without it.
    """
    cause: BaseException | None = exc
    for _ in range(8):  # the chain from DatabaseUnreachable down to the driver's error
        if cause is None:
            return None
        if type(cause).__module__.split(".")[0] == "psycopg":
            lines = str(cause).splitlines()
            first = lines[0] if lines else ""
            _host, sep, reason = first.rpartition(" failed: ")
            words = reason if sep else first.removeprefix("connection failed: ")
            clean = " ".join("".join(c if c.isprintable() else " " for c in words).split())
            if clean.startswith("FATAL:"):
                return clean[:200]
            if "resolve host" in clean or "translate host name" in clean:
                return "the host name did not resolve"
            return _QUOTED.sub('"..."', clean)[:200] or None
        cause = cause.__cause__ or cause.__context__
    return None


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
