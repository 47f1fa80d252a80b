"""Engines for SQLite (WAL, synchronous=FULL, BEGIN IMMEDIATE for writes) and PostgreSQL."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import ConnectionPoolEntry, NullPool, QueuePool

from app.domain.errors import DatabaseBusy, NotMigrated
from app.storage.unavailable import outage_of

SQLITE_BUSY_TIMEOUT_MS = 10_000
# PostgreSQL ends a session of ours left idle inside a transaction this long, and with it
# the row locks it held: a process frozen or cut off mid-transaction (a partitioned host)
# otherwise holds them until TCP notices, hours later (docs/several-hosts.md §4). No
# transaction of ours waits between its statements for anything but its own next statement.
PG_IDLE_IN_TRANSACTION_TIMEOUT_MS = 60_000
PING_AFTER_IDLE_S = 1.0
PG_CONNECT_TIMEOUT_S = 5  # a server that accepts and never answers fails this fast
# A connection whose packets vanish with no reset (a host cut off, a dead route, a server
# host that lost power) fails in 10 to 11 s instead of after TCP's own retries, 15 minutes
# and more: the kernel drops it when what we sent stays unacknowledged this long, or when
# keepalive probes, sent after a few idle seconds, go unanswered as long. A busy server's
# kernel still acknowledges and answers the probes, so a long statement is not cut by it
# (docs/disk-full-and-readiness.md, "A black-holed connection").
PG_TCP_USER_TIMEOUT_MS = 10_000
PG_KEEPALIVES_IDLE_S = 5
PG_KEEPALIVES_INTERVAL_S = 2
PG_KEEPALIVES_COUNT = 3  # where the kernel has no user timeout: idle + interval * count
# How long a transaction waits for one of the process's pooled connections when every one is
# in use (a stalled server, a long lock): then DatabaseBusy, 503 at the api.
POOL_TIMEOUT_S = 30.0
WRITE = "ql_write"


def is_sqlite(url: str) -> bool:
    """True for an ``sqlite://`` URL."""
    return make_url(url).get_backend_name() == "sqlite"


def sqlite_path(url: str) -> Path | None:
    """The database file of an ``sqlite://`` URL; None for PostgreSQL or an in-memory one."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database).absolute()


def make_engine(url: str, *, connections: int = 10) -> Engine:
    """Create an engine with the transaction discipline the repositories rely on.

    On PostgreSQL at most ``connections`` at once, every one kept open once made: no
    overflow connection is opened for a moment of load and closed at its checkin. Each one
    closed took its server process and its prepared statements with it, and the next burst
    paid for a new one (figures: bench/README.md, "Figures behind choices").
    """
    if is_sqlite(url):
        return _sqlite_engine(url)
    engine = create_engine(
        url,
        poolclass=_Pool,
        pool_size=connections,
        max_overflow=0,
        pool_timeout=POOL_TIMEOUT_S,
        # READ COMMITTED: each CAS UPDATE re-checks `version` after waiting for a concurrent
        # writer (PostgreSQL re-evaluates the WHERE clause on the newest row version).
        isolation_level="READ COMMITTED",
    )
    _ping_after_idle(engine)
    _translate_driver_errors(engine)

    @event.listens_for(engine, "do_connect")
    def _on_connect(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        cparams["options"] = pg_session_options(cparams.get("options"))
        for name, value in pg_connection_defaults().items():
            cparams.setdefault(name, value)  # the URL's own query parameter wins

    return engine


def pg_session_options(theirs: str | None) -> str:
    """The ``options`` startup parameter of a session of ours: our settings first, then
    ``theirs`` (the URL's ``options``, a search_path say), or else ``PGOPTIONS``, which libpq
    reads only when no ``options`` is given; the last ``-c`` of a name wins, so theirs do.

    Ours: the idle-in-transaction timeout, and the keepalives on the server's side of the
    session, so that the server drops the session of a client host that vanished (lost
    power, cut off) after about idle + interval * count, not after its default two hours of
    holding a connection slot and a server process for it.
    """
    mine = (
        f"-c idle_in_transaction_session_timeout={PG_IDLE_IN_TRANSACTION_TIMEOUT_MS} "
        f"-c tcp_keepalives_idle={PG_KEEPALIVES_IDLE_S} "
        f"-c tcp_keepalives_interval={PG_KEEPALIVES_INTERVAL_S} "
        f"-c tcp_keepalives_count={PG_KEEPALIVES_COUNT}"
    )
    return f"{mine} {theirs or os.environ.get('PGOPTIONS', '')}".strip()


def pg_connection_defaults() -> dict[str, int]:
    """libpq parameters of every PostgreSQL connection of the service, unless its URL sets
    them: how long a connect may take, and how soon a connection that stopped answering is
    dropped."""
    return {
        "connect_timeout": PG_CONNECT_TIMEOUT_S,
        "keepalives": 1,
        "keepalives_idle": PG_KEEPALIVES_IDLE_S,
        "keepalives_interval": PG_KEEPALIVES_INTERVAL_S,
        "keepalives_count": PG_KEEPALIVES_COUNT,
        "tcp_user_timeout": PG_TCP_USER_TIMEOUT_MS,
    }


# PostgreSQL's undefined_table and undefined_column; SQLite says it in words only.
_PG_SCHEMA_MISSING = frozenset({"42P01", "42703"})
_SQLITE_SCHEMA_MISSING = ("no such table:", "no such column:", "has no column named")


def is_schema_missing(exc: BaseException) -> bool:
    """True when the driver refused a statement because a table or column does not exist:
    the database was never migrated, or is older than this code."""
    state = getattr(exc, "sqlstate", None)  # psycopg.Error, without importing psycopg here
    if isinstance(state, str):
        return state in _PG_SCHEMA_MISSING
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc)
        return any(marker in text for marker in _SQLITE_SCHEMA_MISSING)
    return False


class _Pool(QueuePool):
    """A QueuePool whose checkout, after waiting ``pool_timeout`` for a connection while every
    one is in use, raises DatabaseBusy rather than SQLAlchemy's TimeoutError: the database
    did not take the work in time (a stalled server, a lock held long), which is an outage to
    retry, not a bug. ``_do_get`` is the checkout SQLAlchemy's own pools implement;
    tests/api/test_database_outage.py fails if it stops being the one that times out."""

    def _do_get(self) -> ConnectionPoolEntry:
        try:
            return super()._do_get()
        except PoolTimeout as exc:
            raise DatabaseBusy() from exc


# SQLAlchemy names a pool's logger after its class (here, not under "sqlalchemy"). Its INFO
# lines quote the driver's messages and the connection's address; the code that met the
# failure logs it by type instead, so a service at INFO keeps these out.
logging.getLogger(f"{_Pool.__module__}.{_Pool.__name__}").setLevel(logging.WARNING)


def domain_error(orig: BaseException, *, connecting: bool, disconnect: bool) -> Exception | None:
    """The domain's error for a raw driver error that says "not now" rather than "a bug",
    or None: a missing table is NotMigrated, a lost or refused connection
    DatabaseUnreachable, SQLite's lock held too long DatabaseBusy (``outage_of``).
    ``connecting``: raised while a connection was opened; ``disconnect``: the connection
    is dead. For the reads that run below SQLAlchemy's ``Connection`` too."""
    if is_schema_missing(orig):
        return NotMigrated()
    return outage_of(orig, connecting=connecting, disconnect=disconnect)


def _translate_driver_errors(engine: Engine) -> None:
    """Driver errors that say "not now" rather than "a bug" are raised as the domain's.

    A statement against a missing table raises NotMigrated: ``qinglong api`` never migrates
    (systemd starts it beside ``qinglong migrate``), and until the schema is there every
    request would otherwise end in a bare 500; with this the api answers 503 NOT_MIGRATED and
    the worker refuses with its one line (docs/operations.md). A connection lost or refused
    raises DatabaseUnreachable, SQLite's write lock held past the busy timeout DatabaseBusy
    (app/storage/unavailable.py): 503 with Retry-After as well. SQLAlchemy still invalidates
    a dead connection (and the pool's older ones) before the new error is raised.
    """

    @event.listens_for(engine, "handle_error")
    def _on_error(context: Any) -> BaseException | None:
        if context.is_pre_ping:
            return None  # the pool's own ping: it replaces the connection on its own error
        return domain_error(
            context.original_exception,
            connecting=context.connection is None,
            disconnect=context.is_disconnect,
        )


def _ping_after_idle(engine: Engine) -> None:
    """Ping a pooled connection before use only if it sat idle for a while.

    ``pool_pre_ping`` pings on every checkout: one more round trip for every transaction
    and every read. A connection handed back a moment ago is as alive as the last query
    proved it; one that idled may have been cut (a server restart, an idle timeout), and a
    failed ping makes the pool replace it before anyone uses it.
    """

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("idle_since")
        if since is None or time.monotonic() - since < PING_AFTER_IDLE_S:
            return  # just connected, or used a moment ago
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise DisconnectionError("an idle pooled connection did not answer") from exc


def _sqlite_engine(url: str) -> Engine:
    # A pool timeout only where there is a pool to wait for (NullPool refuses the argument).
    pool: dict[str, Any] = {"poolclass": NullPool}
    if ":memory:" not in url:
        pool = {"poolclass": _Pool, "pool_timeout": POOL_TIMEOUT_S}
    engine = create_engine(
        url,
        **pool,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's begin event issue BEGIN itself (pysqlite's own handling is lazy).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    _translate_driver_errors(engine)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Writers take the lock up front so two processes never deadlock on a lock upgrade.
        if conn.get_execution_options().get(WRITE):
            _begin_immediate(conn)
        else:
            conn.exec_driver_sql("BEGIN")

    return engine


def _begin_immediate(conn: Any) -> None:
    """``BEGIN IMMEDIATE``, polling for the write lock every 0.1-2 ms instead of sleeping.

    SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20, 25... ms between tries, so a
    writer of another process (the api vs the worker) wakes long after the lock was freed:
    the lock stayed idle between transactions and trivial runs/s stalled (figures:
    bench/README.md). Threads of one process already queue on the unit of work's gate.
    """
    raw = conn.connection.dbapi_connection
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    delay = 0.0001
    raw.execute("PRAGMA busy_timeout=0")
    try:
        while time.monotonic() < deadline:
            try:
                raw.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                code = getattr(exc, "sqlite_errorcode", sqlite3.SQLITE_BUSY)
                if code & 0xFF != sqlite3.SQLITE_BUSY:  # _RECOVERY, _SNAPSHOT are busy too
                    raise
            time.sleep(delay)
            delay = min(delay * 1.5, 0.002)
        conn.exec_driver_sql("BEGIN IMMEDIATE")  # once more, raising SQLAlchemy's error
    finally:
        raw.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
