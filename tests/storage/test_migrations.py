"""A database migrated before the dispatch index went descending gets it from 0002."""

from __future__ import annotations

from sqlalchemy import text

from alembic import command
from app.storage.engine import make_engine
from app.storage.migrate import alembic_config, current_revision, head_revision, upgrade_to_head


def _dispatch_index_sql(url: str) -> str:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                query = "SELECT sql FROM sqlite_master WHERE name = 'ix_runs_dispatch_order'"
            else:
                query = (
                    "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_runs_dispatch_order'"
                    " AND schemaname = current_schema()"
                )
            return " ".join(str(conn.execute(text(query)).scalar_one()).split())
    finally:
        engine.dispose()


def _downgrade_to(url: str, revision: str) -> None:
    engine = make_engine(url)
    try:
        config = alembic_config()
        with engine.connect() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, revision)
            conn.commit()
    finally:
        engine.dispose()


def test_an_ascending_dispatch_index_is_rebuilt_descending(db_url: str) -> None:
    assert "priority DESC" in _dispatch_index_sql(db_url)
    _downgrade_to(db_url, "0001")  # the index as the first release of 0001 made it
    assert "priority DESC" not in _dispatch_index_sql(db_url)
    assert "priority" in _dispatch_index_sql(db_url)
    engine = make_engine(db_url)
    try:
        assert current_revision(engine) == "0001"
        upgrade_to_head(engine)
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()
    assert "priority DESC" in _dispatch_index_sql(db_url)
