"""Run Alembic migrations programmatically and tell whether a database is at head."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine

from app.domain.errors import DomainError, ErrorCode, NotMigrated


def migrations_dir() -> Path:
    """The migration scripts shipped inside the package (docs/packaging.md §Migrations)."""
    # Package data, not the checkout: a wheel or `pipx install` has no repository beside it.
    location = resources.files("app.storage").joinpath("migrations")
    if not isinstance(location, Path):  # e.g. a zip import: Alembic needs a real directory
        raise RuntimeError(f"migrations are not in a directory: {location}")
    return location


def alembic_config() -> Config:
    """The project's Alembic configuration, built in code (no alembic.ini is installed)."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("path_separator", "os")
    return config


def upgrade_to_head(engine: Engine) -> None:
    """Apply every migration not yet applied, in one connection (after a read of the
    database's migration on one of its own).

    Raises: NotMigrated (``newer``) when the database is at a migration this build does
    not know: a newer build wrote it, and there is nothing to apply (Alembic would fail).
    """
    newer = unknown_revision(engine)
    if newer is not None:
        raise not_migrated(newer)
    config = alembic_config()
    with engine.connect() as conn, foreign_keys_deferred(conn):
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
        conn.commit()


@contextmanager
def foreign_keys_deferred(conn: Connection) -> Iterator[None]:
    """On SQLite, migrate ``conn`` with its foreign keys off, as SQLite's own procedure for
    rebuilding a table asks (Alembic's batch mode: copy, DROP, rename): with them on, the
    DROP of a table other rows point at fails, so no step that drops a column of ``runs``
    ran on a database that had ever run a job. ``conn`` must not be in a transaction yet (the
    pragma is a no-op inside one); the migration checks every key before its commit
    (``check_foreign_keys``, in env.py), and they are on again for whoever uses the pooled
    connection next. Nothing on PostgreSQL."""
    if conn.dialect.name != "sqlite":
        yield
        return
    raw = conn.connection.driver_connection
    assert raw is not None and not conn.in_transaction()
    raw.execute("PRAGMA foreign_keys=OFF")
    try:
        yield
    finally:
        if conn.in_transaction():
            conn.rollback()
        raw.execute("PRAGMA foreign_keys=ON")


def check_foreign_keys(conn: Connection) -> None:
    """Raise (and so roll the migration back) if a row points at none on SQLite, where the
    migration ran with its foreign keys off (``foreign_keys_deferred``)."""
    if conn.dialect.name != "sqlite":
        return
    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").first()
    if broken is not None:
        raise DomainError(
            ErrorCode.NOT_MIGRATED,
            f"a row of {broken[0]} points at no row of {broken[2]} (rows an older build or a "
            "hand edit left): nothing was migrated, the database stays at its revision; see "
            "`PRAGMA foreign_key_check` in sqlite3, repair or remove those rows, then migrate "
            "again",
        )


def head_revision() -> str:
    """The newest migration id in the scripts."""
    return _revisions()[0]


@functools.cache
def _revisions() -> tuple[str, frozenset[str]]:
    """(the head, every id) of this build's scripts, read once a process: /readyz and every
    start ask, and the scripts a process runs with do not change under it."""
    scripts = ScriptDirectory.from_config(alembic_config())
    head = scripts.get_current_head()
    if head is None:
        raise RuntimeError("no migrations found")
    return head, frozenset(script.revision for script in scripts.walk_revisions())


def current_revision(engine: Engine) -> str | None:
    """The migration id recorded in the database, or None for an empty database."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def unknown_revision(engine: Engine) -> str | None:
    """The database's migration id when this build's scripts do not hold it (a newer build
    migrated the database), else None."""
    with engine.connect() as conn:  # every recorded head: one row normally
        heads = MigrationContext.configure(conn).get_current_heads()
    return next((head for head in heads if not is_known(head)), None)


def not_migrated(current: str | None) -> NotMigrated:
    """The refusal for a database not at this build's head: behind (migrate) or newer."""
    if current is not None and not is_known(current):
        return NotMigrated(newer=current, known=head_revision())
    return NotMigrated()


def is_known(revision: str) -> bool:
    """Whether this build's migration scripts hold ``revision`` (else a newer build wrote it)."""
    return revision in _revisions()[1]
