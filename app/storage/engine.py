"""Engines for SQLite (WAL, synchronous=FULL, BEGIN IMMEDIATE for writes) and PostgreSQL."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

SQLITE_BUSY_TIMEOUT_MS = 10_000
WRITE = "ql_write"


def is_sqlite(url: str) -> bool:
    """True for an ``sqlite://`` URL."""
    return make_url(url).get_backend_name() == "sqlite"


def make_engine(url: str, *, pool_size: int = 5) -> Engine:
    """Create an engine with the transaction discipline the repositories rely on."""
    if is_sqlite(url):
        return _sqlite_engine(url)
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        # READ COMMITTED: each CAS UPDATE re-checks `version` after waiting for a concurrent
        # writer (PostgreSQL re-evaluates the WHERE clause on the newest row version).
        isolation_level="READ COMMITTED",
        connect_args={"connect_timeout": 5},
    )


def _sqlite_engine(url: str) -> Engine:
    engine = create_engine(
        url,
        poolclass=NullPool if ":memory:" in url else None,
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

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Writers take the lock up front so two processes never deadlock on a lock upgrade.
        if conn.get_execution_options().get(WRITE):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")

    return engine
