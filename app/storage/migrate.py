"""Run Alembic migrations programmatically and tell whether a database is at head."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine


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
    """Apply every migration not yet applied, in one connection."""
    config = alembic_config()
    with engine.connect() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
        conn.commit()


def head_revision() -> str:
    """The newest migration id in the scripts."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError("no migrations found")
    return head


def current_revision(engine: Engine) -> str | None:
    """The migration id recorded in the database, or None for an empty database."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
