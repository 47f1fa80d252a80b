"""Alembic environment: runs migrations on the connection the caller hands in, or on the URL."""

from __future__ import annotations

from alembic import context

from app.settings import Settings
from app.storage.engine import make_engine
from app.storage.tables import metadata

config = context.config
target_metadata = metadata


def run_migrations_online() -> None:
    """Migrate through a given connection (tests, `qinglong migrate`) or a fresh engine."""
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.get_main_option("sqlalchemy.url") or Settings.from_env().database_url
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            context.configure(connection=conn, target_metadata=target_metadata)
            with context.begin_transaction():
                context.run_migrations()
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run `qinglong migrate`")
run_migrations_online()
