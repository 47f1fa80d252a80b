"""An api started before ``qinglong migrate`` answers 503 NOT_MIGRATED, not a bare 500.

``qinglong api`` never migrates (docs/operations.md): under systemd it may come up before the
migration has run. Every request that reaches a missing table then says what to do.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.api.main import create_app
from app.domain.profiles import EDGE
from app.settings import Settings
from tests.api.conftest import Client
from tests.conftest import private_pg_schema


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with no schema at all: a new SQLite file, or an empty PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'never-migrated.db'}"
        return
    with private_pg_schema("ql_nomig", migrate=False) as url:
        yield url


def test_requests_before_the_migration_get_503_not_migrated(
    empty_db_url: str, tmp_path: Path
) -> None:
    settings = Settings(data_dir=tmp_path, database_url=empty_db_url, profile=EDGE)
    client = Client(create_app(settings, execution=False))
    try:
        bearer = {"Authorization": "Bearer ql_" + "a" * 43}
        for method, path in (("GET", "/api/v1/tasks"), ("POST", "/api/v1/runs")):
            r = client.request(method, path, headers=bearer, json={"task": "x"})
            assert r.status_code == 503, (method, path, r.text)
            assert r.headers["content-type"].startswith("application/problem+json")
            assert r.json()["code"] == "NOT_MIGRATED"
            assert "qinglong migrate" in r.json()["detail"]
            assert int(r.headers["Retry-After"]) > 0
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "migrate" in ready.json()["detail"]
    finally:
        client.close()
