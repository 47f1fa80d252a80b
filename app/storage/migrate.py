"""Run Alembic migrations programmatically and tell whether a database is at head."""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from app.domain.errors import NotMigrated


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
    with engine.connect() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
        conn.commit()


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
