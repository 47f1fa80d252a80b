"""End-to-end fixtures: a real ``qinglong serve`` on a free 127.0.0.1 port.

Use ``served`` for one default server, or ``serve_factory`` to start several or to pass
options::

    @pytest.mark.e2e
    def test_something(served: Served) -> None:
        r = web.get(f"{served.base_url}/api/v1/runs", headers=served.auth)

    def test_more(serve_factory: ServeFactory) -> None:
        served = serve_factory(workers=2, stop_jobs_on_exit=True, database_url=pg_url)

Each server has a private data dir (under ``tmp_path``), a short worker socket path (a
``mkdtemp(prefix="ql")`` dir, removed at teardown), an admin token created before the start,
and its stderr in ``<data_dir>/serve-<ns>.log`` (shown when the start fails). Pass
``data_dir=served.data_dir`` to start the same service again after ``served.stop()``. Teardown (or an
explicit ``served.stop()``) sends SIGTERM to the supervisor by pid, expects exit status 0
within a bound, then checks that no process that descended from it is left (api, uvicorn
workers, worker, job shims and jobs alike): leftovers are killed by pid after their start
time is re-checked, and the test errors. A test that leaves jobs running must wait for them
or start the server with ``stop_jobs_on_exit=True``. Nothing is ever killed by name.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx
import pytest

from app.domain.tokens import new_api_token
from app.settings import Settings
from app.storage.engine import make_engine
from app.storage.migrate import upgrade_to_head
from app.storage.tokens_repo import TokenRepository
from app.worker.cgroups import PREFIX as CGROUP_PREFIX
from app.worker.cgroups import cgroup2_mounts, mounted_path, own_cgroup
from app.worker.identity import stat_fields
from tests.kit import web
from tests.worker.kit import kill_exact  # pidfd-pinned, start time re-checked

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
REPO_ROOT = Path(__file__).resolve().parents[2]


# -- /proc helpers (pids are always paired with their start time) ---------------------------


def proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgid, start ticks) of ``pid``, or None if there is no such process."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19])


def alive(pid: int, start_ticks: int | None = None) -> bool:
    """``pid`` exists, is not a zombie and (if given) started at ``start_ticks``."""
    stat = proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X", "x"):
        return False
    return start_ticks is None or stat[3] == start_ticks


def _all_stats() -> dict[int, tuple[str, int, int, int]]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := proc_stat(int(name))) is not None:
            out[int(name)] = stat
    return out


def descendants(root: int) -> dict[int, int]:
    """Live descendants of ``root`` as {pid: start ticks} (one /proc snapshot)."""
    stats = _all_stats()
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    found: dict[int, int] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if stats[pid][0] not in ("Z", "X", "x"):
            found[pid] = stats[pid][3]
        todo.extend(children.get(pid, []))
    return found


def job_cgroup(pid: int) -> Path | None:
    """The job cgroup (``ql-<attempt id>``) process ``pid`` is in, or None."""
    try:
        mounts = cgroup2_mounts(Path("/proc/self/mountinfo").read_text())
        own = own_cgroup(Path(f"/proc/{pid}/cgroup").read_text())
    except OSError:
        return None
    if own is None or not own.rsplit("/", 1)[-1].startswith(CGROUP_PREFIX):
        return None
    return mounted_path(mounts, own)


def end_jobs(jobs: dict[int, int]) -> None:
    """SIGKILL each process {pid: start ticks} still alive, and remove the job cgroups the
    kills emptied (the shim that removes its cgroup may be among them)."""
    left = {p: t for p, t in jobs.items() if alive(p, t)}
    cgroups = {job_cgroup(pid) for pid in left} - {None}
    for pid, ticks in left.items():
        kill_exact(pid, ticks)
    for path in cgroups:
        if path is not None:
            remove_empty_cgroup(path)


def remove_empty_cgroup(path: Path) -> None:
    """Remove the cgroup ``path`` once its killed members are gone (up to 2 s)."""
    deadline = time.monotonic() + 2.0
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)


def wait_until(what: str, check: Callable[[], bool], timeout: float) -> None:
    """Poll ``check`` until true or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def free_port() -> int:
    """A port free a moment ago that nothing else of this test run is given before its server
    binds it.

    A port the kernel hands out (``bind`` to port 0) is from its ephemeral range, which every
    outgoing connection draws from too (a client of another test, a database connection), so
    it could be taken between this probe and the server's ``bind``. This one is below that
    range, where only an explicit ``bind`` lands, and in this xdist worker's own slice of it,
    so two tests running at once never probe the same port; tests of one worker run one after
    another. A random start within the slice keeps consecutive tests off a port that may still
    be in ``TIME_WAIT``. (A host whose ephemeral range starts below 11000, or two test runs at
    once on one host, lose part of that promise; the probe's bind still skips a taken port.)
    """
    low, count = _port_slice()
    start = random.randrange(count)
    for step in range(count):
        port = low + (start + step) % count
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in {low}..{low + count - 1}")


def _port_slice() -> tuple[int, int]:
    """The first port and the size of this xdist worker's slice below the ephemeral range."""
    first = 10000
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    span = max(ephemeral_low - first, 1000)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(worker) if worker.isdigit() else 0
    size = span // max(workers, 1)
    return first + (index % max(workers, 1)) * size, size


def worker_ping(socket_path: Path, timeout: float = 5.0) -> dict[str, object]:
    """One ``{"op":"ping"}`` line over the worker's control socket; the decoded answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(socket_path))
        s.sendall(b'{"op":"ping"}\n')
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            buf += chunk
    answer: dict[str, object] = json.loads(buf)
    return answer


# -- the served instance ---------------------------------------------------------------------


@dataclass
class Served:
    """A running ``qinglong serve``; ``pid`` is the supervisor's."""

    base_url: str
    token: str
    data_dir: Path
    socket_path: Path
    pid: int
    port: int
    env: dict[str, str]
    proc: subprocess.Popen[bytes]
    log_path: Path
    _socket_dir: Path
    _start_ticks: int = 0
    exit_code: int | None = field(default=None, init=False)
    left_jobs: dict[int, int] = field(default_factory=dict, init=False)
    killed: bool = field(default=False, init=False)

    @property
    def auth(self) -> dict[str, str]:
        """The admin token as request headers."""
        return {"Authorization": f"Bearer {self.token}"}

    def log(self) -> str:
        """The supervisor's (and its children's) stdout+stderr so far."""
        return self.log_path.read_text(errors="replace")

    def service_pids(self) -> dict[str, int]:
        """Current leaders of the supervised roles: {"api": pid, "worker": pid} (those alive)."""
        found: dict[str, int] = {}
        for pid, (state, ppid, pgid, _) in _all_stats().items():
            if ppid != self.pid or pgid != pid or state in ("Z", "X", "x"):
                continue
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[1:4] == [b"-P", b"-m", b"app"] and argv[4:5] in ([b"api"], [b"worker"]):
                found[argv[4].decode()] = pid
        return found

    def wait_services(self, timeout: float = START_TIMEOUT_S) -> dict[str, int]:
        """Wait until both roles run and answer (/healthz and a worker ping); their pids."""
        wait_until("the api and the worker", lambda: self._answering(), timeout)
        return self.service_pids()

    def healthz_ok(self) -> bool:
        """/healthz answers 200 right now."""
        try:
            return web.get(f"{self.base_url}/healthz", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def ping_pid(self) -> int | None:
        """The worker's pid as its control socket reports it, or None if it does not answer."""
        try:
            pid = worker_ping(self.socket_path).get("pid")
        except (OSError, ValueError):
            return None
        return pid if isinstance(pid, int) else None

    def _answering(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"qinglong serve exited ({self.proc.returncode}):\n{self.log()}")
        return self._up()

    def _up(self) -> bool:
        return set(self.service_pids()) == {"api", "worker"} and (
            self.healthz_ok() and self.ping_pid() is not None
        )

    def stop(self, timeout: float = STOP_TIMEOUT_S, *, leave_jobs: bool = False) -> int:
        """SIGTERM by pid, wait for the exit, check nothing it started is left; the status.

        ``leave_jobs``: processes outside the api's and the worker's process groups (job
        shims and jobs) may outlive the supervisor, as they should; they are recorded in
        ``left_jobs`` and the caller must end them (``kill_exact``) or let them finish.
        """
        if self.exit_code is not None:
            return self.exit_code
        left_before = descendants(self.pid) if self.proc.poll() is None else {}
        if leave_jobs:
            self._leave_jobs(left_before)
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
        try:
            self.exit_code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_exact(self.pid, self._start_ticks)
            self.exit_code = self.proc.wait(timeout=10)
            left_before = {**left_before, **descendants(self.pid)}
            self._cleanup(left_before)
            pytest.fail(f"qinglong serve did not exit within {timeout:.0f} s:\n{self.log()}")
        self._cleanup(left_before)
        return self.exit_code

    def kill_host(self, *, leave_jobs: bool = False) -> None:
        """SIGKILL the supervisor and every process below it, by pid: a host that vanished.

        The supervisor is stopped (SIGSTOP) first, so it neither restarts a killed service
        nor, by dying first, lets PDEATHSIG give the services an orderly stop.
        ``leave_jobs``: only the supervisor and its services die (a crash of the service, not
        of the host); job shims and jobs go on, in ``left_jobs``, as with ``stop``.
        """
        os.kill(self.pid, signal.SIGSTOP)
        below = descendants(self.pid)
        if leave_jobs:
            self._leave_jobs(below)
        for pid, ticks in below.items():
            kill_exact(pid, ticks)
        kill_exact(self.pid, self._start_ticks)
        self.exit_code = self.proc.wait(timeout=10)
        self.killed = True
        shutil.rmtree(self._socket_dir, ignore_errors=True)

    def _leave_jobs(self, below: dict[int, int]) -> None:
        """Move the processes outside the api's and the worker's process groups (job shims
        and jobs) from ``below`` to ``left_jobs``."""
        groups = set(self.service_pids().values())
        for pid, ticks in list(below.items()):
            stat = proc_stat(pid)
            if stat is not None and stat[2] not in groups:
                self.left_jobs[pid] = ticks
                del below[pid]

    def _cleanup(self, known: dict[int, int]) -> None:
        left = {p: t for p, t in known.items() if alive(p, t)}
        end_jobs(left)
        shutil.rmtree(self._socket_dir, ignore_errors=True)
        if left:
            pytest.fail(f"processes left after qinglong serve exited: {sorted(left)}")


class ServeFactory(Protocol):
    """Starts a served instance; all of them are stopped at teardown."""

    def __call__(
        self,
        *,
        workers: int = 1,
        stop_jobs_on_exit: bool = False,
        database_url: str | None = None,
        extra_env: dict[str, str] | None = None,
        data_dir: Path | None = None,
        file_size_limit: int | None = None,
    ) -> Served: ...


def _create_admin_token(settings: Settings) -> str:
    settings.ensure_data_dir()
    engine = make_engine(settings.database_url)
    try:
        upgrade_to_head(engine)
        token = new_api_token()
        name = f"e2e-admin-{time.time_ns()}"
        TokenRepository(engine).create(name=name, scopes=frozenset({"admin"}), token=token)
    finally:
        engine.dispose()
    return token


def spawn_served(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    data_dir: Path,
    socket_dir: Path,
    token: str,
    port: int,
    log_path: Path,
) -> Served:
    """Start ``argv`` (a ``qinglong serve``) with its output in ``log_path``; its Served."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    stat = proc_stat(proc.pid)
    return Served(
        base_url=f"http://127.0.0.1:{port}",
        token=token,
        data_dir=data_dir,
        socket_path=socket_dir / "w.sock",
        pid=proc.pid,
        port=port,
        env=env,
        proc=proc,
        log_path=log_path,
        _socket_dir=socket_dir,
        _start_ticks=stat[3] if stat else 0,
    )


def _launch(
    data_dir: Path,
    env: dict[str, str],
    workers: int,
    stop_jobs: bool,
    token: str,
    file_size_limit: int | None = None,
) -> Served:
    socket_dir = Path(tempfile.mkdtemp(prefix="ql"))
    env = {**env, "QL_WORKER_SOCKET": str(socket_dir / "w.sock")}
    for _ in range(3):  # a free port may be taken between probing and binding
        port = free_port()
        argv = [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--workers", str(workers), "--data-dir", str(data_dir)]
        if stop_jobs:
            argv.append("--stop-jobs-on-exit")
        if file_size_limit is not None:  # as a shell starts it: ``ulimit -f`` (512-byte blocks)
            blocks = file_size_limit // 512
            argv = ["/bin/sh", "-c", f'ulimit -f {blocks} && exec "$@"', "sh", *argv]
        log_path = data_dir / f"serve-{time.time_ns()}.log"
        served = spawn_served(
            argv, cwd=REPO_ROOT, env=env, data_dir=data_dir, socket_dir=socket_dir,
            token=token, port=port, log_path=log_path,
        )  # fmt: skip
        proc = served.proc
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if served._up():
                return served
            time.sleep(0.05)
        if proc.poll() is None:
            served.stop()
            pytest.fail(f"qinglong serve did not become healthy:\n{served.log()}")
        if "cannot listen" not in served.log():
            served._cleanup({})
            pytest.fail(f"qinglong serve exited ({proc.returncode}):\n{served.log()}")
    shutil.rmtree(socket_dir, ignore_errors=True)
    pytest.fail("qinglong serve could not bind a free port three times")


def _factory(base: Path, started: list[Served]) -> ServeFactory:
    def start(
        *,
        workers: int = 1,
        stop_jobs_on_exit: bool = False,
        database_url: str | None = None,
        extra_env: dict[str, str] | None = None,
        data_dir: Path | None = None,
        file_size_limit: int | None = None,
    ) -> Served:
        # Pass an earlier instance's data_dir (and database_url) to start it again.
        data_dir = data_dir or base / f"serve{len(started)}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
        env["QL_DATA_DIR"] = str(data_dir)
        if database_url:
            env["QL_DATABASE_URL"] = database_url
        env.update(extra_env or {})
        token = _create_admin_token(Settings.from_env(env))
        served = _launch(data_dir, env, workers, stop_jobs_on_exit, token, file_size_limit)
        started.append(served)
        return served

    return start


def _stop_all(started: list[Served]) -> None:
    errors = []
    for served in started:
        try:
            code = served.stop()
        except pytest.fail.Exception as exc:
            errors.append(str(exc))
            continue
        if code != 0 and not served.killed:
            errors.append(f"qinglong serve exited with {code}:\n{served.log()}")
    if errors:
        pytest.fail("\n".join(errors))


@pytest.fixture
def serve_factory(tmp_path: Path) -> Iterator[ServeFactory]:
    """Start real ``qinglong serve`` instances; each is stopped and checked at teardown."""
    started: list[Served] = []
    yield _factory(tmp_path, started)
    _stop_all(started)


@pytest.fixture(scope="module")
def module_serve_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeFactory]:
    """``serve_factory`` for a module's tests that can share instances (each start costs
    seconds); stopped and checked after the module's last test."""
    started: list[Served] = []
    yield _factory(tmp_path_factory.mktemp("serve"), started)
    _stop_all(started)


@pytest.fixture
def served(serve_factory: ServeFactory) -> Served:
    """One ``qinglong serve`` with defaults (SQLite, one uvicorn worker)."""
    return serve_factory()
