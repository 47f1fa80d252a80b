"""``qinglong serve`` survives its children being killed, reloads on SIGHUP, stops on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import (
    REPO_ROOT,
    Served,
    ServeFactory,
    alive,
    descendants,
    free_port,
    kill_exact,
    proc_stat,
    wait_until,
)

pytestmark = pytest.mark.e2e

RESTART_TIMEOUT_S = 30.0


def uvicorn_workers(api_pid: int) -> dict[int, int]:
    """The uvicorn worker processes under the api manager: {pid: start ticks}."""
    out = {}
    for pid, ticks in descendants(api_pid).items():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            out[pid] = ticks
    return out


def test_sigterm_stops_both_services_and_exits_zero(served: Served) -> None:
    assert served.healthz_ok()
    pids = served.service_pids()
    assert served.ping_pid() == pids["worker"]
    groups = {pid: proc_stat(pid) for pid in pids.values()}

    assert served.stop() == 0

    for pid, stat in groups.items():
        assert stat is not None
        assert not alive(pid, stat[3])
    assert not served.socket_path.exists()


def test_killed_api_manager_is_replaced_and_its_workers_do_not_linger(
    serve_factory: ServeFactory,
) -> None:
    served = serve_factory(workers=2)
    old_api = served.service_pids()["api"]
    wait_until("two uvicorn workers", lambda: len(uvicorn_workers(old_api)) == 2, 30)
    old_workers = uvicorn_workers(old_api)
    worker_pid = served.service_pids()["worker"]

    os.kill(old_api, signal.SIGKILL)

    # The orphaned uvicorn workers would keep the port: the supervisor kills its group.
    wait_until(
        "the old uvicorn workers to be gone",
        lambda: not any(alive(p, t) for p, t in old_workers.items()),
        RESTART_TIMEOUT_S,
    )
    wait_until(
        "a new api answering",
        lambda: served.service_pids().get("api") not in (None, old_api) and served.healthz_ok(),
        RESTART_TIMEOUT_S,
    )
    assert served.service_pids()["worker"] == worker_pid
    assert "api exited (signal SIGKILL)" in served.log()


def test_killed_worker_is_restarted(served: Served) -> None:
    old = served.service_pids()["worker"]
    assert served.ping_pid() == old

    os.kill(old, signal.SIGKILL)

    wait_until(
        "the worker socket answering from a new pid",
        lambda: served.ping_pid() not in (None, old),
        RESTART_TIMEOUT_S,
    )
    assert served.ping_pid() == served.service_pids()["worker"]
    assert served.healthz_ok()
    # What the first start said of the settings is not said again at each restart (a
    # database outage restarts the worker every few seconds).
    wait_until("the new worker listening", lambda: served.log().count("worker listening") == 2, 10)
    first, restarted = served.log().split("supervisor INFO worker started")[1:]
    assert "worker WARNING jobs run as the service's own user (uid" in first
    assert "worker WARNING" not in restarted, restarted


def test_a_worker_refused_under_serve_says_so_in_the_service_log_format(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env |= {"QL_DATA_DIR": str(data_dir)}
    run = [sys.executable, "-m", "app"]
    subprocess.run([*run, "migrate"], cwd=REPO_ROOT, env=env, check=True, capture_output=True)
    # A worker of this data dir outside any serve (as a systemd unit runs it) holds the lease.
    holder = subprocess.Popen(
        [*run, "worker"], cwd=REPO_ROOT, env=env | {"QL_WORKER_SOCKET": str(tmp_path / "a.sock")},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until("the holder listening", (tmp_path / "a.sock").exists, 30)
        refused = subprocess.run(
            [*run, "serve", "--host", "127.0.0.1", "--port", str(free_port())], cwd=REPO_ROOT,
            env=env | {"QL_WORKER_SOCKET": str(tmp_path / "b.sock")}, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip
    finally:
        holder.terminate()
        holder.wait(timeout=30)
    assert refused.returncode == 75, refused.stderr
    (line,) = [ln for ln in refused.stderr.splitlines() if "worker lease" in ln]
    # time, role, level, then the line (it had none of them: "qinglong: the worker lease ...")
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} worker ERROR the worker lease on this "
        rf"database is held by instance \S+ on host \S+ \(pid {holder.pid}, epoch 1\).*",
        line,
    ), line


@pytest.mark.parametrize("workers", [1, 2])
def test_sighup_restarts_the_api_only(serve_factory: ServeFactory, workers: int) -> None:
    served = serve_factory(workers=workers)
    pids = served.service_pids()
    if workers > 1:
        wait_until("uvicorn workers", lambda: len(uvicorn_workers(pids["api"])) == workers, 30)
        old_servers = uvicorn_workers(pids["api"])
    else:
        stat = proc_stat(pids["api"])
        assert stat is not None
        old_servers = {pids["api"]: stat[3]}

    os.kill(served.pid, signal.SIGHUP)

    wait_until(
        "every old api server process replaced",
        lambda: not any(alive(p, t) for p, t in old_servers.items()),
        RESTART_TIMEOUT_S,
    )
    wait_until("the api answering again", served.healthz_ok, RESTART_TIMEOUT_S)
    after = served.service_pids()
    assert after["worker"] == pids["worker"]
    assert served.ping_pid() == pids["worker"]
    if workers > 1:  # the manager stays; uvicorn replaced its workers one by one
        assert after["api"] == pids["api"]
        assert len(uvicorn_workers(after["api"])) == workers


SUPERVISED_JOB_PARENT = textwrap.dedent(
    """
    import os, sys, time
    # Like the worker launching a shim: double fork, the grandchild in its own session.
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(sys.argv[1] + ".tmp", "w") as fh:
                fh.write(str(os.getpid()))
            os.rename(sys.argv[1] + ".tmp", sys.argv[1])
            time.sleep(float(sys.argv[2]))
            os._exit(0)
        os._exit(0)
    time.sleep(3600)
    """
)

SUPERVISOR_MAIN = textwrap.dedent(
    """
    import logging, os, sys
    from app.supervisor.supervisor import ServiceSpec, Supervisor
    logging.basicConfig(level=logging.INFO)
    spec = ServiceSpec("worker", [sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]])
    raise SystemExit(Supervisor(services=[spec], env=dict(os.environ), stop_timeout_s=5).run())
    """
)


Supervisors = list[subprocess.Popen[bytes]]


@pytest.fixture
def supervisors() -> Iterator[Supervisors]:
    """Supervisors a test started; one still running at teardown (the test failed midway) is
    killed with everything below it (its worker and the jobs it adopted), by exact identity."""
    started: Supervisors = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                below = descendants(proc.pid)
                proc.kill()  # our unreaped child: the pid is still ours
                proc.wait(timeout=30)
                for pid, ticks in below.items():
                    kill_exact(pid, ticks)


def _start_supervisor(
    tmp_path: Path, job_seconds: float, supervisors: Supervisors
) -> tuple[subprocess.Popen[bytes], Path]:
    marker = tmp_path / "job.pid"
    argv = [sys.executable, "-c", SUPERVISOR_MAIN, SUPERVISED_JOB_PARENT, str(marker)]
    with (tmp_path / "sup.log").open("wb") as log:
        proc = subprocess.Popen(
            [*argv, str(job_seconds)],
            cwd=Path(__file__).resolve().parents[2],
            stdin=subprocess.DEVNULL,
            stderr=log,
        )
    supervisors.append(proc)
    wait_until("the job to start", marker.exists, 30)
    return proc, marker


def test_orphaned_jobs_are_adopted_reaped_and_never_killed_on_stop(
    tmp_path: Path, supervisors: Supervisors
) -> None:
    # A short job: once it ends, the subreaper reaps it (no zombie stays behind).
    proc, marker = _start_supervisor(tmp_path, 0.2, supervisors)
    try:
        job = int(marker.read_text())
        # The middle process may still be exiting when the marker appears.
        wait_until(
            "the double-forked job to be re-parented to the supervisor (or to end)",
            lambda: (stat := proc_stat(job)) is None or stat[1] == proc.pid,
            10,
        )
        wait_until("the job to be reaped", lambda: proc_stat(job) is None, 30)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0

    # A long job: SIGTERM stops the service but leaves the job running.
    marker.unlink()
    proc, marker = _start_supervisor(tmp_path, 3600, supervisors)
    job = int(marker.read_text())
    wait_until(
        "the long job to be re-parented to the supervisor",
        lambda: (stat := proc_stat(job)) is not None and stat[1] == proc.pid,
        10,
    )
    stat = proc_stat(job)
    assert stat is not None
    service = {p: t for p, t in descendants(proc.pid).items() if p != job}
    assert service
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert alive(job, stat[3]), "a supervisor stop must not kill jobs"
        assert not any(alive(p, t) for p, t in service.items())
    finally:
        kill_exact(job, stat[3])
