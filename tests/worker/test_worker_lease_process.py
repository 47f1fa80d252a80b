"""The worker lease with real ``qinglong worker`` processes on one database (both engines).

Each worker has its own data dir (so its own instance id) and socket; the database is
shared. Faults are real: a second live worker, SIGKILL of the holder, SIGSTOP of the
holder for longer than the lease's TTL.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.context.worker_lease import EXIT_LEASE_HELD, EXIT_LEASE_LOST
from app.storage.lease_repo import LeaseRepository
from app.worker.instance import INSTANCE_FILE
from tests.worker.kit import DEADLINE, ROOT, Worker, stop_outside_a_write

TTL_S = 1.5


@pytest.fixture
def workers(db_url: str, tmp_path: Path, short_dir: Path) -> Iterator[dict[str, Worker]]:
    """Workers ``a`` and ``b`` on one database, with a short lease; ended by pid."""
    made = {}
    for name in ("a", "b"):
        data_dir = tmp_path / name
        data_dir.mkdir()
        worker = Worker(data_dir, db_url, short_dir / f"{name}.sock")
        worker.env |= {"QL_WORKER_LEASE_TTL_S": str(TTL_S), "QL_WORKER_LEASE_RENEW_S": "0.2"}
        made[name] = worker
    try:
        yield made
    finally:
        for worker in made.values():
            worker.close()


def _instance(worker: Worker) -> str:
    return (worker.data_dir / INSTANCE_FILE).read_text().strip()


def _run_refused(worker: Worker) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", "worker"], cwd=ROOT, env=worker.env, text=True,
        capture_output=True, timeout=2 * DEADLINE, check=False,
    )  # fmt: skip


def test_a_second_live_worker_refuses_with_one_line_naming_the_holder(
    workers: dict[str, Worker], engine: Engine, short_dir: Path
) -> None:
    a, b = workers["a"], workers["b"]
    # A live holder is refused whatever its TTL; a long one keeps a renewal stalled while
    # the refused workers start (a loaded host) from losing the lease mid-test.
    a.env["QL_WORKER_LEASE_TTL_S"] = "60"
    a.start()
    assert a.proc is not None
    # Another worker of the same data dir (same instance) is refused on both engines; on
    # SQLite another instance is too (one host per database, docs/several-hosts.md).
    twin = Worker(a.data_dir, a.env["QL_DATABASE_URL"], short_dir / "twin.sock")
    twin.env = a.env | {"QL_WORKER_SOCKET": str(twin.socket_path)}
    refused = [twin] + ([b] if engine.dialect.name == "sqlite" else [])
    for worker in refused:
        done = _run_refused(worker)
        assert done.returncode == EXIT_LEASE_HELD
        [line] = [ln for ln in done.stderr.splitlines() if ln.startswith("qinglong:")]
        assert f"instance {_instance(a)}" in line and f"pid {a.proc.pid}" in line
        assert "stop that worker" in line
        assert ("SQLite runs one worker per database" in line) == (worker is b)
        assert not worker.socket_path.exists()  # refused before it served anything
    assert a.client.ping()["pid"] == a.proc.pid  # the holder is untouched
    assert [e.type for e in LeaseRepository(engine).history(limit=10)] == [
        "worker.lease_acquired"
    ]


def test_the_same_instance_re_takes_its_lease_at_once_after_kill_9(
    workers: dict[str, Worker], engine: Engine
) -> None:
    a = workers["a"]
    a.env["QL_WORKER_LEASE_TTL_S"] = "60"  # waiting for an expiry would time the start out
    a.start()
    assert a.signal(signal.SIGKILL) == -signal.SIGKILL
    a.start()
    repo = LeaseRepository(engine)
    current = repo.current(_instance(a))
    assert current is not None and current.epoch == 2
    last = repo.history(limit=10)[-1]
    assert (last.type, last.data["reason"], last.data["previous_epoch"]) == (
        "worker.lease_acquired", "restart", 1,
    )  # fmt: skip


# On PostgreSQL each host has its own lease (tests/e2e/test_several_hosts.py): SQLite only.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_holder_stopped_past_its_ttl_is_taken_over_and_then_stops_serving(
    workers: dict[str, Worker], engine: Engine
) -> None:
    a, b = workers["a"], workers["b"]
    a.start()
    assert a.proc is not None
    stop_outside_a_write(a.proc, engine)  # a partitioned or frozen host: no renewals
    try:
        time.sleep(TTL_S + 0.5)
        b.start()  # takes over the expired lease
    finally:
        a.proc.send_signal(signal.SIGCONT)
    assert a.proc.wait(DEADLINE) == EXIT_LEASE_LOST  # fail closed, no restart of serving
    a.proc = None
    lost = [ln for ln in a.stderr().splitlines() if "worker lease" in ln and "stops" in ln]
    assert len(lost) == 1, a.stderr()
    assert f"instance {_instance(b)}" in lost[0]
    assert not a.socket_path.exists()
    assert b.client.ping()["pid"] == b.proc.pid  # type: ignore[union-attr]
    takeover = LeaseRepository(engine).history(limit=10)[-1]
    assert takeover.type == "worker.lease_taken_over"
    assert (takeover.data["old_instance_id"], takeover.data["new_instance_id"]) == (
        _instance(a), _instance(b),
    )  # fmt: skip
    assert (takeover.data["old_epoch"], takeover.data["new_epoch"]) == (1, 2)
