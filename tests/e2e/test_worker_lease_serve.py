"""Real ``qinglong serve`` instances on one PostgreSQL database (docs/worker-lease.md,
docs/several-hosts.md).

Each has its own data dir and port on 127.0.0.1. A second host (another data dir) serves
alongside the first, each holding its own lease; a second service on the first's data dir
is refused while the first lives (one line naming it, a non-zero exit, no restart loop).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.context.worker_lease import EXIT_LEASE_HELD
from app.storage.engine import make_engine
from app.storage.lease_repo import LeaseRepository
from app.worker.instance import INSTANCE_FILE
from tests.conftest import PG_ENV, private_pg_schema
from tests.e2e.conftest import REPO_ROOT, ServeFactory, alive, end_jobs, free_port, wait_until
from tests.e2e.kit import enqueue, get_run, put_task, terminal_events, wait_status

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
    # --stop-jobs-on-exit: a refused serve must still leave the holder's jobs alone.
    argv += ["--port", str(free_port()), "--data-dir", str(data_dir), "--stop-jobs-on-exit"]
    return subprocess.run(
        argv, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=90, check=False,
    )  # fmt: skip


def _instance(data_dir: Path) -> str:
    return (data_dir / INSTANCE_FILE).read_text().strip()


def test_a_second_host_serves_alongside_and_a_second_service_of_one_data_dir_is_refused(
    shared_pg_url: str, serve_factory: ServeFactory, tmp_path: Path
) -> None:
    first = serve_factory(database_url=shared_pg_url, extra_env=LEASE_ENV)
    worker_pid = first.service_pids()["worker"]
    second = serve_factory(database_url=shared_pg_url, extra_env=LEASE_ENV)  # another host

    refused = _serve_until_exit(first.data_dir, shared_pg_url)  # the first host's data dir

    # Refused by the first's lock on its data dir before anything starts; a worker of the
    # data dir outside it (a copy, a systemd unit) meets the lease (tests/storage/
    # test_worker_lease.py), and its refusal is the same exit status.
    assert refused.returncode == EXIT_LEASE_HELD, refused.stderr
    assert refused.stderr == (
        f"qinglong: another qinglong serve runs on the data dir {first.data_dir}; refusing "
        "to start (nothing of it was touched)\n"
    )
    assert first.healthz_ok() and first.ping_pid() == worker_pid  # the first is untouched
    assert second.healthz_ok() and second.ping_pid() is not None
    engine = make_engine(shared_pg_url)
    try:
        leases = {lease.instance_id: lease for lease in LeaseRepository(engine).leases()}
        history = LeaseRepository(engine).history(limit=10)
    finally:
        engine.dispose()
    assert set(leases) == {_instance(first.data_dir), _instance(second.data_dir)}
    assert leases[_instance(second.data_dir)].base_url == second.base_url
    assert [(e.type, e.data["reason"]) for e in history] == [("worker.lease_acquired", "new")] * 2
    # An operator reads every host's lease from the command line.
    env = second.env | {"QL_DATABASE_URL": shared_pg_url}
    shown = subprocess.run(
        [sys.executable, "-m", "app", "lease", "show"], cwd=REPO_ROOT, env=env, text=True,
        capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    assert shown.stdout.count(": held, expires") == 2, shown.stdout
    assert f"api {first.base_url}" in shown.stdout


def test_a_host_stopped_for_good_is_retired_and_its_job_stopped_if_it_comes_back(
    shared_pg_url: str, serve_factory: ServeFactory
) -> None:
    """A worker stopped in order releases its lease and leaves its jobs running; if its host
    never comes back no live worker expires that lease, so its runs stayed ``running``. The
    operator's ``lease retire`` ends them lost (refused while the lease is held); should the
    host start again after all, its journal settle stops the job by identity, and the run
    keeps its one ending."""
    served = serve_factory(database_url=shared_pg_url, extra_env=LEASE_ENV)
    put_task(served, "long", "sleep 600")
    run_id = enqueue(served, "long")
    wait_status(served, run_id, {"running"})
    env = served.env | {"QL_DATABASE_URL": shared_pg_url}
    instance = _instance(served.data_dir)

    def retire() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "app", "lease", "retire", instance], cwd=REPO_ROOT, env=env,
            text=True, capture_output=True, timeout=60, check=False,
        )  # fmt: skip

    refused = retire()
    assert refused.returncode == 1 and "holds its lease" in refused.stderr, refused.stderr
    try:
        assert served.stop(leave_jobs=True) == 0
        assert any(alive(p, t) for p, t in served.left_jobs.items()), "the job goes on"
        done = retire()
        assert done.returncode == 0, done.stderr
        assert "1 attempt(s) still active ended lost WORKER_RETIRED" in done.stdout
        shown = subprocess.run(
            [sys.executable, "-m", "app", "lease", "show"], cwd=REPO_ROOT, env=env, text=True,
            capture_output=True, timeout=60, check=True,
        )  # fmt: skip
        assert "retired from host" in shown.stdout, shown.stdout
        # Retiring does not reach the host: the job still runs until its worker is back.
        assert any(alive(p, t) for p, t in served.left_jobs.items())
        again = serve_factory(data_dir=served.data_dir, database_url=shared_pg_url,
                              extra_env=LEASE_ENV)  # fmt: skip
        wait_until(
            "the retired run's job to be stopped",
            lambda: not any(alive(p, t) for p, t in served.left_jobs.items()),
            30,
        )
    finally:
        end_jobs(served.left_jobs)
    run = get_run(again, run_id)
    assert run["status"] == "lost" and run["latest_attempt"]["error_code"] == "WORKER_RETIRED"
    assert terminal_events(again, run_id) == ["run.lost"]
