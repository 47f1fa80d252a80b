"""A database that fails a request for a while answers 503 with Retry-After, never 500.

Real outages only. PostgreSQL is reached through a TCP relay the test cuts: every open
connection closed and new ones refused, which is what the api sees of a server restart or a
cut network. SQLite's write lock is held by another process past the busy timeout. Both
recover by themselves once the database answers again, and a retried enqueue makes exactly
one run.
"""

from __future__ import annotations

import select as io_select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from app.api import problems
from app.context.token_cache import TokenCache
from app.domain.profiles import EDGE
from app.settings import Settings
from app.storage import engine as engine_module
from app.storage.engine import make_engine
from app.storage.run_reads import RunReader
from app.storage.tables import runs
from tests.api.conftest import Client, admin_client_with_a_task
from tests.conftest import private_pg_schema
from tests.kit.partition import partitioned, shorten_bounds
from tests.kit.relay import Relay, relayed
from tests.worker.kit import wait_for


def _assert_503(r: httpx.Response, code: str) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["retry-after"] == "10"
    assert r.json()["code"] == code
    assert r.json()["type"] == f"urn:qinglong:problem:{code}"


def _unreachable_count(client: Client, admin: dict[str, str]) -> float:
    r = client.get("/metrics", headers=admin)
    assert r.status_code == 200, r.text
    series = 'qinglong_api_database_unavailable_total{code="DATABASE_UNREACHABLE"} '
    (line,) = [line for line in r.text.splitlines() if line.startswith(series)]
    return float(line.removeprefix(series))


def _client_with_a_run(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Client, dict[str, str], str]:
    """An app on ``url`` with one run enqueued and read back; the caller closes the client.

    The token stays cached across an outage: each request then reaches its own read or
    write, not the token lookup (which would answer the same 503 on a slow host)."""
    defaults = TokenCache.__init__.__kwdefaults__ or {}
    monkeypatch.setattr(TokenCache.__init__, "__kwdefaults__", {**defaults, "ttl_s": 3600.0})
    client, admin = admin_client_with_a_task(
        Settings(data_dir=tmp_path / "data", database_url=url, profile=EDGE)
    )
    try:
        r = client.post("/api/v1/runs", json={"task": "hello"}, headers=admin)
        assert r.status_code == 201, r.text
        run_id: str = r.json()["id"]
        assert client.get(f"/api/v1/runs/{run_id}", headers=admin).status_code == 200
    except BaseException:
        client.close()
        raise
    return client, admin, run_id


def _runs_in(url: str) -> int:
    """How many runs the database at ``url`` holds, read on a connection of its own."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(runs)).scalar_one())
    finally:
        engine.dispose()


@pytest.fixture
def relayed_pg() -> Iterator[tuple[str, Relay]]:
    """A private migrated schema, and its URL through a relay the test can cut."""
    with private_pg_schema("ql_outage") as url, relayed(url) as (through, relay):
        yield through, relay


@pytest.mark.postgres
def test_postgres_lost_and_refused_connections_answer_503_and_recover(
    relayed_pg: tuple[str, Relay],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(problems, "_outage_logged_at", {})  # no line held back by another test
    url, relay = relayed_pg
    client, admin, run_id = _client_with_a_run(url, tmp_path, monkeypatch)
    try:
        counted = _unreachable_count(client, admin)

        relay.cut()  # the pooled connections die under the api; new ones are refused
        again = {**admin, "Idempotency-Key": "after-the-cut"}
        _assert_503(
            client.post("/api/v1/runs", json={"task": "hello"}, headers=again),
            "DATABASE_UNREACHABLE",
        )
        # The hot read (its own connections on the event loop), a sync read, another write.
        _assert_503(client.get(f"/api/v1/runs/{run_id}", headers=admin), "DATABASE_UNREACHABLE")
        _assert_503(client.get("/api/v1/tasks", headers=admin), "DATABASE_UNREACHABLE")
        _assert_503(
            client.put("/api/v1/secrets/s1", json={"value": "v"}, headers=admin),
            "DATABASE_UNREACHABLE",
        )
        # A token the cache does not hold cannot be checked: 503 before the body is read,
        # and the connection closes (no trickled body holds it through the outage).
        stranger = {"Authorization": "Bearer ql_" + "B" * 43}
        unchecked = client.post("/api/v1/runs", json={"task": "hello"}, headers=stranger)
        _assert_503(unchecked, "DATABASE_UNREACHABLE")
        assert unchecked.headers["connection"] == "close"
        said = [r.getMessage() for r in caplog.records if r.name == "qinglong.api"]
        assert not [m for m in said if m.startswith("unhandled")]  # no 500 path was taken
        # One line for the outage, however many requests it refused, naming no request data.
        outage = [m for m in said if "503 DATABASE_UNREACHABLE" in m]
        assert outage == [
            "answered 503 DATABASE_UNREACHABLE on POST /api/v1/runs (one such line per 10 s at most)"
        ]
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert "database: database unreachable" in ready.json()["detail"]

        relay.resume()  # no restart of the api: its pools connect afresh
        r = client.post("/api/v1/runs", json={"task": "hello"}, headers=again)
        assert r.status_code == 201, r.text  # the refused attempt kept nothing
        replay = client.post("/api/v1/runs", json={"task": "hello"}, headers=again)
        assert replay.status_code == 200 and replay.json()["id"] == r.json()["id"]
        assert client.get(f"/api/v1/runs/{run_id}", headers=admin).status_code == 200
        assert client.get("/api/v1/tasks", headers=admin).status_code == 200
        assert client.get("/readyz").status_code == 200
        # Each refused request counted once, by its code (the readiness probe is NOT_READY).
        assert _unreachable_count(client, admin) == counted + 5
    finally:
        client.close()
    assert _runs_in(url) == 2


@pytest.mark.postgres
def test_a_silent_partition_answers_503_within_the_bound_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Packets dropped, no reset (tests/kit/partition.py): without the keepalive and user
    # timeout the requests below would wait for TCP, a quarter of an hour. Bounds of a second.
    shorten_bounds(monkeypatch)
    reads: list[str] = []  # each read of one run the api sends to the database
    get_run_async = RunReader.get_run_async

    async def counted(self: RunReader, run_id: str) -> object:
        reads.append(run_id)
        return await get_run_async(self, run_id)

    monkeypatch.setattr(RunReader, "get_run_async", counted)
    with private_pg_schema("ql_outage") as direct, partitioned(direct) as (url, partition):
        client, admin, run_id = _client_with_a_run(url, tmp_path, monkeypatch)
        try:
            partition.drop()
            again = {**admin, "Idempotency-Key": "in-the-partition"}
            for method, path, body in (
                ("POST", "/api/v1/runs", {"task": "hello"}),
                ("GET", f"/api/v1/runs/{run_id}", None),  # the event loop's own connections
                ("GET", "/api/v1/tasks", None),
            ):
                started, reads[:] = time.monotonic(), []
                r = client.request(method, path, json=body, headers=again)
                # the user timeout on the pooled connection, then a connect's timeout
                assert time.monotonic() - started < 8.0, (method, path)
                _assert_503(r, "DATABASE_UNREACHABLE")
                if method == "GET" and path.endswith(run_id):
                    # The hot read answered its own 503: its route did not wait again.
                    assert reads == [run_id]

            partition.heal()
            r = client.post("/api/v1/runs", json={"task": "hello"}, headers=again)
            assert r.status_code == 201, r.text  # the refused attempt kept nothing
            assert client.get(f"/api/v1/runs/{run_id}", headers=admin).status_code == 200
        finally:
            client.close()
        assert _runs_in(direct) == 2


def test_sqlite_write_lock_held_by_another_process_answers_503_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 300)
    data = tmp_path / "data"
    data.mkdir()
    path = data / "q.db"
    url = f"sqlite:///{path}"
    settings = Settings(data_dir=data, database_url=url, profile=EDGE)
    client, admin = admin_client_with_a_task(settings, migrate=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_THE_WRITE_LOCK, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        ready, _, _ = io_select.select([holder.stdout], [], [], 30)
        assert ready and holder.stdout.readline() == "held\n"
        r = client.post("/api/v1/runs", json={"task": "hello"}, headers=admin)
        _assert_503(r, "DATABASE_BUSY")
        # Readers are not held up by a writer (WAL): the task is still there to read.
        assert client.get("/api/v1/tasks/hello", headers=admin).status_code == 200
    finally:
        holder.stdin.close()  # the holder rolls back and exits
        try:
            assert holder.wait(10) == 0
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
            holder.stdout.close()
    try:
        r = client.post("/api/v1/runs", json={"task": "hello"}, headers=admin)
        assert r.status_code == 201, r.text
    finally:
        client.close()
    assert _runs_in(url) == 1  # the refused write left nothing behind


_HOLD_THE_WRITE_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.read()
conn.execute("ROLLBACK")
"""


POOL_CONNECTIONS = 10  # make_engine's default, the api's pool


@pytest.mark.postgres
def test_postgres_connections_all_held_by_a_stalled_database_answer_503_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lock held long (a migration by hand, a frozen session) stalls every read of a table
    # on the server: each holds one of the api's ten pooled connections while it waits. The
    # next request, a read or a write, waits the pool timeout for one and answers 503, not
    # 500; once the lock goes the stalled ones answer. (Reads: an enqueue stalled this way
    # would hold the queue's advisory lock, which is database-wide, and stall every other
    # test's enqueue on the server meanwhile.)
    monkeypatch.setattr(engine_module, "POOL_TIMEOUT_S", 1.0)
    defaults = TokenCache.__init__.__kwdefaults__ or {}
    monkeypatch.setattr(TokenCache.__init__, "__kwdefaults__", {**defaults, "ttl_s": 3600.0})
    with private_pg_schema("ql_stall") as url:
        client, admin = admin_client_with_a_task(
            Settings(data_dir=tmp_path / "data", database_url=url, profile=EDGE)
        )
        locker = make_engine(url)
        stalled: list[httpx.Response] = []
        reads: list[threading.Thread] = []
        try:
            with locker.connect() as lock:
                lock.exec_driver_sql("LOCK TABLE task_revisions IN ACCESS EXCLUSIVE MODE")
                me = lock.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
                reads += [
                    threading.Thread(
                        target=lambda: stalled.append(
                            client.get("/api/v1/tasks/hello", headers=admin)
                        )
                    )
                    for _ in range(POOL_CONNECTIONS)
                ]
                for read in reads:
                    read.start()
                waiting = (
                    "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
                )
                # Autocommit: a transaction would read one snapshot of pg_stat_activity.
                with locker.connect().execution_options(isolation_level="AUTOCOMMIT") as probe:
                    wait_for(
                        lambda: (
                            probe.exec_driver_sql(waiting, (me,)).scalar_one() == POOL_CONNECTIONS
                        ),
                        "every pooled connection of the api to wait on the lock",
                    )
                    _assert_503(client.get("/api/v1/tasks/hello", headers=admin), "DATABASE_BUSY")
                    _assert_503(
                        client.post("/api/v1/runs", json={"task": "hello"}, headers=admin),
                        "DATABASE_BUSY",
                    )
                lock.rollback()  # the lock goes
            for read in reads:
                read.join(30)
            assert sorted(r.status_code for r in stalled) == [200] * POOL_CONNECTIONS
            with locker.connect() as conn:  # the refused enqueue left nothing behind
                assert conn.execute(select(func.count()).select_from(runs)).scalar_one() == 0
        finally:
            for read in reads:  # the lock is gone (its connection closed): they end
                read.join(30)
            client.close()
            locker.dispose()
