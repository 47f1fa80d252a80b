"""`alembic upgrade head` yields exactly the tables, columns and indexes of the MetaData."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, inspect, text

from app.storage.engine import make_engine
from app.storage.migrate import current_revision, head_revision, upgrade_to_head
from app.storage.tables import metadata
from tests.conftest import PG_ENV, _with_search_path


def _describe(engine: Engine) -> dict[str, Any]:
    insp = inspect(engine)
    schema: dict[str, Any] = {}
    for table in sorted(set(insp.get_table_names()) - {"alembic_version"}):
        columns = {
            c["name"]: (str(c["type"]).split("(")[0], str(c["type"]), c["nullable"])
            for c in insp.get_columns(table)
        }
        indexes = sorted(
            (i["name"], tuple(i["column_names"]), bool(i["unique"]))
            for i in insp.get_indexes(table)
        )
        uniques = sorted(
            (u["name"], tuple(u["column_names"])) for u in insp.get_unique_constraints(table)
        )
        pk = insp.get_pk_constraint(table)
        fks = sorted(
            (f["name"], tuple(f["constrained_columns"]), f["referred_table"])
            for f in insp.get_foreign_keys(table)
        )
        schema[table] = {
            "index_sql": _index_sql(engine, table),
            "columns": columns,
            "indexes": indexes,
            "uniques": uniques,
            "pk": (pk["name"], tuple(pk["constrained_columns"])),
            "fks": fks,
        }
    return schema


def _index_sql(engine: Engine, table: str) -> list[str]:
    """Index definitions as the database itself states them (reflection drops DESC)."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            query = "SELECT sql FROM sqlite_master WHERE type='index' AND tbl_name=:t AND sql IS NOT NULL"
        else:
            query = "SELECT indexdef FROM pg_indexes WHERE tablename=:t AND schemaname=current_schema()"
        rows = conn.execute(text(query), {"t": table}).scalars().all()
    schema_prefix = re.compile(r"\bON \w+\.")  # PostgreSQL names the (per-test) schema
    return sorted(schema_prefix.sub("ON ", " ".join(str(r).replace('"', "").split())) for r in rows)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def two_empty_databases(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[tuple[str, str]]:
    """Two empty databases of one engine kind."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
        return
    import os

    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"PostgreSQL tests need {PG_ENV}")
    names = [f"ql_schema_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    admin = make_engine(base)
    with admin.begin() as conn:
        for name in names:
            conn.execute(text(f'CREATE SCHEMA "{name}"'))
    try:
        yield _with_search_path(base, names[0]), _with_search_path(base, names[1])
    finally:
        with admin.begin() as conn:
            for name in names:
                conn.execute(text(f'DROP SCHEMA "{name}" CASCADE'))
        admin.dispose()


def test_migrations_create_exactly_the_metadata(two_empty_databases: tuple[str, str]) -> None:
    migrated_url, created_url = two_empty_databases
    migrated, created = make_engine(migrated_url), make_engine(created_url)
    try:
        assert current_revision(migrated) is None
        upgrade_to_head(migrated)
        assert current_revision(migrated) == head_revision()
        metadata.create_all(created)
        from_migrations, from_code = _describe(migrated), _describe(created)
        assert set(from_migrations) == {t.name for t in metadata.sorted_tables}
        assert from_migrations == from_code
        # The dispatch order and newest-first list indexes exist.
        index_names = {i[0] for i in from_migrations["runs"]["indexes"]}
        assert {"ix_runs_ready_page", "ix_runs_task_status_id"} <= index_names
        page_index = [d for d in from_migrations["runs"]["index_sql"] if "ready_page" in d]
        assert "priority DESC" in page_index[0] and "not_before_ms IS NULL" in page_index[0]
    finally:
        migrated.dispose()
        created.dispose()


def test_upgrade_twice_is_a_no_op(two_empty_databases: tuple[str, str]) -> None:
    url, _ = two_empty_databases
    engine = make_engine(url)
    try:
        upgrade_to_head(engine)
        before = _describe(engine)
        upgrade_to_head(engine)
        assert _describe(engine) == before
    finally:
        engine.dispose()
