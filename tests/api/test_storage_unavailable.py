"""A write the database cannot commit answers 503 STORAGE_UNAVAILABLE with Retry-After.

Real refusals only: SQLite on a real full tmpfs ("database or disk is full"); PostgreSQL with
the run tables in a tablespace on a real full tmpfs (53100 disk_full) and a session that is
read-only (25006). /readyz says so too, and both recover once space returns.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy import create_engine, text

from app.api.main import create_app
from app.domain.profiles import EDGE
from app.settings import Settings
from app.storage.engine import make_engine
from app.storage.tables import metadata
from tests.api.conftest import Client, admin_client_with_a_task
from tests.conftest import PG_ENV, private_pg_schema
from tests.disk import fill, mounted_tmpfs

ATTEMPTS = 2000  # posts until the database must extend a file (WAL or heap) on the full disk


def _post_until_refused(client: Client, admin: dict[str, str]) -> httpx.Response:
    for _ in range(ATTEMPTS):
        r = client.post("/api/v1/runs", json={"task": "hello"}, headers=admin)
        assert r.status_code in (201, 503), r.text  # never 500 INTERNAL_ERROR
        if r.status_code == 503:
            return r
    raise AssertionError(f"{ATTEMPTS} runs were stored on a full disk")


def _assert_storage_unavailable(r: httpx.Response) -> None:
    assert r.status_code == 503
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["retry-after"] == "10"
    body = r.json()
    assert body["code"] == "STORAGE_UNAVAILABLE"
    assert body["type"] == "urn:qinglong:problem:STORAGE_UNAVAILABLE"


def _readyz_detail(client: Client) -> str:
    r = client.get("/readyz")
    assert r.status_code == 503, r.text
    assert r.json()["code"] == "NOT_READY"
    detail: str = r.json()["detail"]
    return detail


def test_sqlite_on_a_full_disk_answers_503_and_recovers(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "data") as data:
        url = f"sqlite:///{data / 'q.db'}"
        settings = Settings(data_dir=data, database_url=url, profile=EDGE)
        client, admin = admin_client_with_a_task(settings, migrate=True)
        try:
            filler = fill(data)
            _assert_storage_unavailable(_post_until_refused(client, admin))
            r = client.post("/api/v1/runs/0190f0f0-0000-7000-8000-000000000000/cancel",
                            headers=admin)  # fmt: skip
            assert r.status_code in (404, 503), r.text
            detail = _readyz_detail(client)
            assert "database: database cannot commit writes" in detail
            assert "disk: free space in the data dir below the profile reserve" in detail
            filler.unlink()
            r = client.post("/api/v1/runs", json={"task": "hello"}, headers=admin)
            assert r.status_code == 201, r.text
            assert client.get("/readyz").status_code == 200
        finally:
            client.close()


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A private, migrated PostgreSQL schema; its URL (search_path set)."""
    with private_pg_schema("ql_full") as url:
        yield url


@pytest.mark.postgres
def test_postgres_out_of_space_answers_503(pg_schema: str, tmp_path: Path) -> None:
    try:
        pg_uid = pwd.getpwnam("postgres").pw_uid
    except KeyError:
        pytest.skip("the PostgreSQL server is not local (no postgres user): no real full disk")
    name = f"ql_full_{uuid.uuid4().hex[:8]}"
    admin = create_engine(os.environ[PG_ENV], isolation_level="AUTOCOMMIT")
    # Outside pytest's 0700 tmp tree: the server (another user) must reach the mount.
    mount_point = Path(tempfile.mkdtemp(prefix="ql-pg-"))
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(mount_point.rmdir)
        disk = cleanup.enter_context(mounted_tmpfs(mount_point, size_mib=16, uid=pg_uid))
        location = disk / "ts"
        location.mkdir()
        os.chown(location, pg_uid, -1)
        engine = make_engine(pg_schema)
        try:
            with admin.connect() as conn:
                conn.execute(text(f"CREATE TABLESPACE {name} LOCATION '{location}'"))
            with engine.begin() as conn:
                for table in metadata.sorted_tables:
                    conn.execute(text(f'ALTER TABLE "{table.name}" SET TABLESPACE {name}'))
            data = tmp_path / "data"
            client, admin_auth = admin_client_with_a_task(
                Settings(data_dir=data, database_url=pg_schema, profile=EDGE)
            )
            try:
                filler = fill(disk)
                _assert_storage_unavailable(_post_until_refused(client, admin_auth))
                assert "database: database cannot commit writes" in _readyz_detail(client)
                filler.unlink()
                r = client.post("/api/v1/runs", json={"task": "hello"}, headers=admin_auth)
                assert r.status_code == 201, r.text
            finally:
                client.close()
        finally:
            with engine.begin() as conn:  # back to the default, so both can be dropped
                for table in metadata.sorted_tables:
                    conn.execute(text(f'ALTER TABLE "{table.name}" SET TABLESPACE pg_default'))
            engine.dispose()
            with admin.connect() as conn:
                conn.execute(text(f"DROP TABLESPACE IF EXISTS {name}"))
            admin.dispose()


@pytest.mark.postgres
def test_postgres_read_only_session_answers_503(pg_schema: str, tmp_path: Path) -> None:
    client, admin = admin_client_with_a_task(
        Settings(data_dir=tmp_path / "data", database_url=pg_schema, profile=EDGE)
    )
    client.close()
    read_only = pg_schema + quote(" -cdefault_transaction_read_only=on")
    client = Client(
        create_app(
            Settings(data_dir=tmp_path / "data", database_url=read_only, profile=EDGE),
            execution=False,
        )
    )
    try:
        r = client.post("/api/v1/runs", json={"task": "hello"}, headers=admin)
        _assert_storage_unavailable(r)
        r = client.put("/api/v1/secrets/s1", json={"value": "v"}, headers=admin)
        _assert_storage_unavailable(r)
        assert "database: database is read-only" in _readyz_detail(client)
    finally:
        client.close()
