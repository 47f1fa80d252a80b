"""Alembic environment: runs migrations on the connection the caller hands in, or on the URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from app.settings import Settings
from app.storage.engine import make_engine
from app.storage.migrate import check_foreign_keys, foreign_keys_deferred
from app.storage.tables import metadata

config = context.config
target_metadata = metadata


def run_migrations_online() -> None:
    """Migrate through a given connection (tests, `qinglong migrate`: its caller defers
    SQLite's foreign keys, app/storage/migrate.py) or a fresh engine (`alembic` run by hand)."""
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(**_options(connection))
        _migrate(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or Settings.from_env().database_url
    engine = make_engine(url)
    try:
        with engine.connect() as conn, foreign_keys_deferred(conn):
            context.configure(**_options(conn))
            _migrate(conn)
            conn.commit()
    finally:
        engine.dispose()


def _options(conn: Connection) -> dict[str, object]:
    # One transaction for every step and the foreign-key check, on SQLite too: Alembic
    # takes SQLite's DDL as not transactional and committed each step alone, so a failed
    # check (after the steps) rolled nothing back, and the next start found nothing to do.
    # SQLite's DDL is transactional, so one transaction holds them all, and a process
    # killed between two steps leaves the revision it had (tests/storage/test_migrate_killed.py).
    return {"connection": conn, "target_metadata": target_metadata, "transactional_ddl": True}


def _migrate(conn: Connection) -> None:
    """Run the steps asked for; when any ran, check SQLite's foreign keys before the commit
    (a start with nothing to apply does not scan every table)."""
    with context.begin_transaction():
        before = context.get_context().get_current_heads()
        context.run_migrations()
        if context.get_context().get_current_heads() != before:
            check_foreign_keys(conn)


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run `qinglong migrate`")
run_migrations_online()
