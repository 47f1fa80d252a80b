"""Several hosts on one PostgreSQL database (docs/several-hosts.md), with real services.

Two ``qinglong serve`` instances, each with its own data dir and port, share one database;
host B runs under ``unshare --pid --fork --mount-proc`` so that it sees its own processes
only, as another machine would (its pids mean nothing on host A). Faults are real: a host
killed with every process it runs (by pid), a host partitioned by SIGSTOP of its whole
process tree and then continued, and a host cut off from the database by a network
partition that drops packets (tests/kit/partition.py) and then healed. The lease is short
(2 s) so expiries come quickly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, select

from app.storage.engine import PG_IDLE_IN_TRANSACTION_TIMEOUT_MS, make_engine
from app.storage.lease_repo import LeaseRepository
from app.storage.tables import attempts
from app.worker import cgroups
from app.worker.instance import INSTANCE_FILE
from tests.conftest import PG_ENV, private_pg_schema
from tests.e2e.conftest import (
    REPO_ROOT,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    Served,
    ServeFactory,
    _all_stats,
    _create_admin_token,
    descendants,
    free_port,
    spawn_served,
    wait_until,
)
from tests.e2e.kit import events, get_run, put_task, terminal_events, wait_status
from tests.kit import web
from tests.kit.partition import partitioned

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TTL_S = 2.0
LEASE_ENV = {"QL_WORKER_LEASE_TTL_S": str(TTL_S), "QL_WORKER_LEASE_RENEW_S": "0.4"}
UNSHARE = shutil.which("unshare")


@dataclass
class NsServed(Served):
    """A ``qinglong serve`` in its own PID namespace; ``pid`` is ``unshare``'s (host view)."""

    def supervisor(self) -> int | None:
        """The supervisor's pid as this host sees it (unshare's one child; PID 1 inside)."""
        kids = [p for p, (_, ppid, _, _) in _all_stats().items() if ppid == self.pid]
        return kids[0] if kids else None

    def service_pids(self) -> dict[str, int]:
        sup = self.supervisor()
        found: dict[str, int] = {}
        for pid, (state, ppid, pgid, _) in _all_stats().items():
            if sup is None or ppid != sup or pgid != pid or state in ("Z", "X", "x"):
                continue
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if argv[4:5] in ([b"api"], [b"worker"]):
                found[argv[4].decode()] = pid
        return found

    def stop(self, timeout: float = STOP_TIMEOUT_S, *, leave_jobs: bool = False) -> int:
        """SIGTERM to the supervisor (unshare forwards nothing); its exit ends the namespace."""
        if self.exit_code is not None:
            return self.exit_code
        known = descendants(self.pid)
        sup = self.supervisor()
        if sup is not None and self.proc.poll() is None:
            os.kill(sup, signal.SIGTERM)
        try:
            self.exit_code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_host()
            pytest.fail(f"qinglong serve did not exit within {timeout:.0f} s:\n{self.log()}")
        self._cleanup(known)
        return self.exit_code

    def signal_tree(self, sig: int) -> None:
        """``sig`` to unshare and every process below it, by pid (a partition or its end)."""
        for pid in [self.pid, *descendants(self.pid)]:
            os.kill(pid, sig)


@pytest.fixture
def shared_pg_url() -> Iterator[str]:
    why = f"several hosts need PostgreSQL: set {PG_ENV}"
    with private_pg_schema("ql_hosts", migrate=False, why=why) as url:
        yield url


@pytest.fixture
def ns_hosts(tmp_path: Path) -> Iterator[list[NsServed]]:
    """Starts hosts in their own PID namespace; each is stopped and checked at teardown."""
    if UNSHARE is None or os.geteuid() != 0:
        pytest.skip("a PID namespace per host needs unshare(1) and root")
    started: list[NsServed] = []
    yield started
    errors = [s.log() for s in started if s.stop() != 0 and not s.killed]
    if errors:
        pytest.fail("\n".join(errors))


def _start_ns_host(url: str, data_dir: Path, env_extra: dict[str, str]) -> NsServed:
    assert UNSHARE is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env |= {"QL_DATA_DIR": str(data_dir), "QL_DATABASE_URL": url} | env_extra
    socket_dir = Path(tempfile.mkdtemp(prefix="ql"))
    env["QL_WORKER_SOCKET"] = str(socket_dir / "w.sock")
    from app.settings import Settings

    token = _create_admin_token(Settings.from_env(env))
    port = free_port()
    argv = [UNSHARE, "--pid", "--fork", "--mount-proc", sys.executable, "-m", "app", "serve"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir)]
    served = spawn_served(
        argv, cwd=REPO_ROOT, env=env, data_dir=data_dir, socket_dir=socket_dir, token=token,
        port=port, log_path=data_dir / "serve.log",
    )  # fmt: skip
    ns = NsServed(**{f: getattr(served, f) for f in served.__dataclass_fields__ if f in (
        "base_url", "token", "data_dir", "socket_path", "pid", "port", "env", "proc",
        "log_path", "_socket_dir", "_start_ticks",
    )})  # fmt: skip
    wait_until("host B to serve", lambda: ns._answering(), START_TIMEOUT_S)
    return ns


def _hosts(
    serve_factory: ServeFactory, ns_hosts: list[NsServed], url: str, tmp: Path, env: dict[str, str]
) -> tuple[Served, NsServed]:
    a = serve_factory(database_url=url, extra_env=LEASE_ENV | env)
    (tmp / "b").mkdir()
    b = _start_ns_host(url, tmp / "b", LEASE_ENV | env)
    ns_hosts.append(b)
    return a, b


def _instance(served: Served) -> str:
    return (served.data_dir / INSTANCE_FILE).read_text().strip()


def _remove_job_cgroup(engine: Engine, run_id: str) -> None:
    """The job cgroup of a host killed with everything it ran: its shim died before it could
    remove it, and only that host's next worker would settle it (this one never comes
    back). The test leaves nothing behind."""
    with engine.connect() as conn:
        attempt_id = conn.execute(
            select(attempts.c.id)
            .where(attempts.c.run_id == run_id)
            .order_by(attempts.c.number.desc())
        ).scalar()
    root = cgroups.detect("auto")
    path = None if root is None else root.job_dir(cgroups.PREFIX + str(attempt_id))
    if path is not None:
        assert cgroups.settle(path, patience=0.0, timeout=5.0)
        assert not path.exists()


def _ran_on(engine: Engine, run_id: str) -> str | None:
    with engine.connect() as conn:
        return conn.execute(
            select(attempts.c.worker_instance_id)
            .where(attempts.c.run_id == run_id)
            .order_by(attempts.c.number.desc())
        ).scalar()


def _enqueue(served: Served, task: str) -> str:
    r = web.post(f"{served.base_url}/api/v1/runs", json={"task": task}, headers=served.auth)
    assert r.status_code == 201, r.text
    run_id: str = r.json()["id"]
    return run_id


def _log(served: Served, run_id: str, **params: str) -> httpx.Response:
    url = f"{served.base_url}/api/v1/runs/{run_id}/attempts/1/log"
    return web.get(url, params=params, headers=served.auth, timeout=10)


def _job_processes(served: NsServed) -> list[int]:
    """Pids (host view) of jobs below host B: ``sleep`` processes."""
    found = []
    for pid in descendants(served.pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"sleep"):
            found.append(pid)
    return found


def _spread_and_read_logs(a: Served, b: NsServed, engine: Engine) -> str:
    """Runs through both apis end with their exit codes on both hosts; every log reads the
    same through either api (bytes, tail, SSE). A run of host B's, for later."""
    lines = 'i=0; while [ $i -lt 300 ]; do echo "line $i of $QL3_RUN_ID"; i=$((i+1)); done'
    for code in (0, 3, 7):
        put_task(a, f"exit{code}", f"{lines}; sleep 0.5; exit {code}")
    runs = {_enqueue((a, b)[n % 2], f"exit{(0, 3, 7)[n % 3]}"): (0, 3, 7)[n % 3] for n in range(4)}
    for run_id, code in runs.items():
        run = wait_status(a, run_id, {"succeeded", "failed", "lost", "cancelled"}, timeout=60)
        assert run["status"] == ("succeeded" if code == 0 else "failed"), run
        assert run["latest_attempt"]["exit_code"] == code
        assert terminal_events(b, run_id) == [f"run.{run['status']}"]
    hosts = {run_id: _ran_on(engine, run_id) for run_id in runs}
    assert set(hosts.values()) == {_instance(a), _instance(b)}  # both hosts ran runs
    expected = {run_id: "".join(f"line {i} of {run_id}\n" for i in range(300)) for run_id in runs}
    for run_id in runs:  # each log read through both apis: one of them forwards it
        for served in (a, b):
            got = _log(served, run_id)
            assert got.status_code == 200, got.text
            assert got.text == expected[run_id]
    on_b = next(r for r, h in hosts.items() if h == _instance(b))
    tail = _log(a, on_b, tail_bytes="20")
    assert tail.status_code == 200 and tail.text == expected[on_b][-20:]
    follow = _log(a, on_b, follow="true")  # SSE, forwarded the same way
    assert follow.headers["content-type"].startswith("text/event-stream")
    chunks = [
        json.loads(line.removeprefix("data: "))["text"]
        for block in follow.text.split("\n\n")
        if block.startswith("event: chunk")
        for line in block.splitlines()
        if line.startswith("data: ")
    ]
    assert "".join(chunks) == expected[on_b] and "event: end" in follow.text
    return on_b


def test_two_hosts_share_runs_and_logs_survive_a_partition_and_expire_a_killed_host(
    shared_pg_url: str, serve_factory: ServeFactory, ns_hosts: list[NsServed], tmp_path: Path
) -> None:
    # QL_MAX_RUNNING is per host: one run at a time on each.
    a, b = _hosts(serve_factory, ns_hosts, shared_pg_url, tmp_path, {"QL_MAX_RUNNING": "1"})
    engine = make_engine(shared_pg_url)
    try:
        logged_on_b = _spread_and_read_logs(a, b, engine)
        _partition_then_kill(a, b, engine)
    finally:
        engine.dispose()
    refused = _log(a, logged_on_b)  # its host is gone: its log with it
    assert refused.status_code == 503
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert refused.json()["code"] == "LOG_HOST_UNAVAILABLE"


def test_a_host_cut_off_from_the_database_by_a_silent_partition_is_expired_and_comes_back(
    shared_pg_url: str, serve_factory: ServeFactory, ns_hosts: list[NsServed], tmp_path: Path
) -> None:
    # A real network partition, packets dropped with no reset (tests/kit/partition.py),
    # between host B and the database only: B's processes run on, its api still answers.
    # Its URL shortens the connection bounds to a second (the URL's own parameters win).
    with partitioned(shared_pg_url) as (through, partition):
        bounds = "tcp_user_timeout=1000&keepalives_idle=1&keepalives_interval=1&connect_timeout=2"
        budget = LEASE_ENV | {"QL_MAX_RUNNING": "1"}
        a = serve_factory(database_url=shared_pg_url, extra_env=budget)
        (tmp_path / "b").mkdir()
        joiner = "&" if "?" in through else "?"
        b = _start_ns_host(f"{through}{joiner}{bounds}", tmp_path / "b", budget)
        ns_hosts.append(b)

        def cut_off_but_alive(on_b: str) -> None:
            # B's api answers its own 503 (no wait for TCP), and the job runs on there.
            r = web.get(f"{b.base_url}/api/v1/runs/{on_b}", headers=b.auth, timeout=30)
            assert r.status_code == 503, r.text
            assert r.json()["code"] == "DATABASE_UNREACHABLE"
            assert len(_job_processes(b)) == 1

        engine = make_engine(shared_pg_url)
        try:
            on_a = _partition_and_come_back(
                a, b, engine, cut=partition.drop, heal=partition.heal,
                # Cut off inside a transaction, B's session keeps its row locks until the
                # server ends it (several-hosts.md §4), as under the freeze.
                lost_within=TTL_S + PG_IDLE_IN_TRANSACTION_TIMEOUT_MS / 1000 + 10,
                meanwhile=cut_off_but_alive,
                # Awake, it sees its renewals fail within the bounds and stops by itself.
                said="could not be renewed before it expired",
            )  # fmt: skip
        finally:
            engine.dispose()
        r = web.post(f"{a.base_url}/api/v1/runs/{on_a}/cancel", headers=a.auth)
        assert r.status_code in (200, 202), r.text
        assert wait_status(a, on_a, {"cancelled"}, timeout=30)["status"] == "cancelled"
        assert b.stop() == 0  # while its database is still reachable through the relay
        assert "Traceback" not in b.log()


def _partition_and_come_back(
    a: Served,
    b: NsServed,
    engine: Engine,
    *,
    cut: Callable[[], None],
    heal: Callable[[], None],
    lost_within: float,
    said: str,
    meanwhile: Callable[[str], None] = lambda _run_id: None,
) -> str:
    """A run on each host; host B cut off longer than its lease: A ends B's run ``lost``
    and leaves its own; B's worker stops serving (its log ``said`` why) and its next worker,
    once B reaches the database again, stops the job that kept running there before
    anything else. A's run, still running."""
    # Long past every wait here (the expiry waits for the lease and a frozen session's end):
    # A's run must still be running when looked at, and each test cancels it at its end.
    # 30 s ended it first once under CI's load.
    put_task(a, "long", "exec sleep 600")
    first, second = _enqueue(a, "long"), _enqueue(b, "long")  # one per host: budget 1 each
    for run_id in (first, second):
        wait_status(a, run_id, {"running"}, timeout=30)
    on = {_ran_on(engine, first): first, _ran_on(engine, second): second}
    on_a, on_b = on[_instance(a)], on[_instance(b)]
    wait_until("B's job to run", lambda: len(_job_processes(b)) == 1, 10)

    cut()
    try:
        lost = wait_status(a, on_b, {"lost"}, timeout=lost_within)
        meanwhile(on_b)
    finally:
        heal()
    assert lost["latest_attempt"]["error_code"] == "WORKER_LEASE_EXPIRED"
    assert get_run(a, on_a)["status"] == "running"  # the live host's run is untouched
    wait_until("B's job to be stopped", lambda: not _job_processes(b), 30)
    wait_until("B's worker back", lambda: b.ping_pid() is not None, 30)
    assert terminal_events(a, on_b) == ["run.lost"]  # never a second ending
    assert get_run(a, on_b)["status"] == "lost"
    leases = LeaseRepository(engine)
    history = [(e.type, e.data) for e in leases.history(limit=20)]
    expired = [d for t, d in history if t == "worker.lease_expired"]
    assert [(d["instance_id"], d["by_instance_id"], d["attempts_lost"]) for d in expired] == [
        (_instance(b), _instance(a), 1)
    ]
    restarted = [d for t, d in history if t == "worker.lease_acquired" and d["reason"] == "restart"]
    assert restarted and restarted[-1]["instance_id"] == _instance(b)
    assert said in b.log()  # the one line of the worker that stopped serving
    return on_a


def _partition_then_kill(a: Served, b: NsServed, engine: Engine) -> None:
    # Frozen mid-transaction (its renewal, say), B holds row locks until the server ends its
    # session: the expiry may then wait for that timeout too (several-hosts.md §4).
    frozen_session_s = PG_IDLE_IN_TRANSACTION_TIMEOUT_MS / 1000
    on_a = _partition_and_come_back(
        a, b, engine,
        cut=lambda: b.signal_tree(signal.SIGSTOP),  # host B frozen whole
        heal=lambda: b.signal_tree(signal.SIGCONT),
        lost_within=TTL_S + frozen_session_s + 10,
        said="superseded",  # frozen, it learns only once it runs again
    )  # fmt: skip

    # A host killed with everything it runs: its attempt ends after the lease.
    third = _enqueue(b, "long")
    wait_status(a, third, {"running"}, timeout=30)
    assert _ran_on(engine, third) == _instance(b)
    b.kill_host()
    ended = wait_status(a, third, {"lost"}, timeout=TTL_S + 10)
    assert ended["latest_attempt"]["error_code"] == "WORKER_LEASE_EXPIRED"
    assert terminal_events(a, third) == ["run.lost"]
    _remove_job_cgroup(engine, third)
    assert get_run(a, on_a)["status"] == "running"
    r = web.post(f"{a.base_url}/api/v1/runs/{on_a}/cancel", headers=a.auth)
    assert r.status_code in (200, 202), r.text
    assert wait_status(a, on_a, {"cancelled"}, timeout=30)["status"] == "cancelled"
    assert [e["type"] for e in events(a, on_a)].count("run.cancelled") == 1
