"""Two real ``qinglong serve`` instances on one PostgreSQL database (docs/worker-lease.md).

Each has its own data dir and port on 127.0.0.1. The second is refused while the first
lives (one line naming the first, a non-zero exit, no restart loop); once the first host
has vanished (every process SIGKILLed by pid) and its lease's TTL has passed, the second
starts and the takeover is in the service history.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.context.worker_lease import EXIT_LEASE_HELD
from app.storage.engine import make_engine
from app.storage.lease_repo import LeaseRepository
from app.worker.instance import INSTANCE_FILE
from tests.conftest import PG_ENV, private_pg_schema
from tests.e2e.conftest import REPO_ROOT, ServeFactory, free_port

pytestmark = pytest.mark.e2e

TTL_S = 3.0
LEASE_ENV = {"QL_WORKER_LEASE_TTL_S": str(TTL_S), "QL_WORKER_LEASE_RENEW_S": "0.5"}


@pytest.fixture
def shared_pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL schema both services share (dropped at the end)."""
    why = f"two services on one database need PostgreSQL: set {PG_ENV}"
    with private_pg_schema("ql_lease", migrate=False, why=why) as url:
        yield url


def _serve_until_exit(data_dir: Path, url: str) -> subprocess.CompletedProcess[str]:
    """``qinglong serve`` expected to stop by itself; killed by pid after a bound if not."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env |= {"QL_DATA_DIR": str(data_dir), "QL_DATABASE_URL": url} | LEASE_ENV
    argv = [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1"]
    argv += ["--port", str(free_port()), "--data-dir", str(data_dir)]
    return subprocess.run(
        argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=90, check=False,
    )  # fmt: skip


def _instance(data_dir: Path) -> str:
    return (data_dir / INSTANCE_FILE).read_text().strip()


def test_a_second_service_is_refused_then_takes_over_after_the_first_host_vanished(
    shared_pg_url: str, serve_factory: ServeFactory, tmp_path: Path
) -> None:
    first = serve_factory(database_url=shared_pg_url, extra_env=LEASE_ENV)
    worker_pid = first.service_pids()["worker"]
    second_dir = tmp_path / "second"

    refused = _serve_until_exit(second_dir, shared_pg_url)

    assert refused.returncode == EXIT_LEASE_HELD, refused.stderr
    lines = [ln for ln in refused.stderr.splitlines() if "worker lease" in ln]
    assert len(lines) == 1, refused.stderr
    assert lines[0].startswith("qinglong: the worker lease on this database is held by")
    assert f"instance {_instance(first.data_dir)}" in lines[0]
    assert f"pid {worker_pid}" in lines[0]
    assert refused.stderr.count("worker started") == 1  # refused once, never restarted
    assert first.healthz_ok() and first.ping_pid() == worker_pid  # the first is untouched

    first.kill_host()
    engine = make_engine(shared_pg_url)
    try:
        repo = LeaseRepository(engine)
        held = repo.current()
        assert held is not None and held.released_at_ms is None  # nobody released it
        time.sleep(TTL_S)
        second = serve_factory(database_url=shared_pg_url, extra_env=LEASE_ENV, data_dir=second_dir)
        assert second.healthz_ok()
        history = repo.history(limit=10)
    finally:
        engine.dispose()
    assert [e.type for e in history] == ["worker.lease_acquired", "worker.lease_taken_over"]
    takeover = history[-1].data
    assert takeover["reason"] == "expired"
    assert (takeover["old_instance_id"], takeover["old_epoch"]) == (_instance(first.data_dir), 1)
    assert (takeover["new_instance_id"], takeover["new_epoch"]) == (_instance(second_dir), 2)
    # An operator reads the same history from the command line.
    env = second.env | {"QL_DATABASE_URL": shared_pg_url}
    shown = subprocess.run(
        [sys.executable, "-m", "app", "lease", "history"], cwd=REPO_ROOT, env=env, text=True,
        capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    assert "worker.lease_taken_over" in shown.stdout
    assert _instance(second_dir) in shown.stdout
