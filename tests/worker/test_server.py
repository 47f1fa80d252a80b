"""The control socket and its client: permissions, peer uid, framing, ops, reconnects."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from app.adapters.worker_client import WorkerClient
from app.domain.errors import LaunchFailed, LaunchOutcomeUnknown, LaunchRejected, WorkerUnavailable
from app.domain.execution import Launched, LaunchRequest, StopResult
from app.domain.ids import uuid7
from app.domain.model import ProcessHandle
from app.worker.identity import current_boot_id
from app.worker.server import MAX_REQUEST_BYTES, ControlServer, SocketInUse
from tests.jobuser import JOB_UID, job_user_or_skip, reachable_dir
from tests.worker.kit import concurrently

HANDLE = ProcessHandle(
    boot_id=current_boot_id(),
    pid=4242,
    pgid=4242,
    start_ticks=7,
    shim_pid=4241,
    shim_start_ticks=6,
)


class FakeLauncher:
    """Records requests (never their secrets in output) and answers per attempt id."""

    def __init__(self) -> None:
        self.calls: list[LaunchRequest] = []
        self.outcome: dict[str, Exception] = {}
        self.running: set[str] = set()  # attempts whose T2 the fake "committed"
        self.t2: list[bool] = []  # whether each request left T2 to the worker

    def launch_started(self, request: LaunchRequest, *, t2: bool = False) -> Launched:
        self.calls.append(request)
        self.t2.append(t2)
        if request.attempt_id in self.outcome:
            raise self.outcome[request.attempt_id]
        return Launched(HANDLE, 123, running=t2 and request.attempt_id in self.running)


class FakeController:
    def __init__(self) -> None:
        self.calls: list[tuple[ProcessHandle, float]] = []

    def stop(self, handle: ProcessHandle, *, grace_seconds: float) -> StopResult:
        self.calls.append((handle, grace_seconds))
        return "already_exited"


@pytest.fixture
def server(short_dir: Path) -> Iterator[ControlServer]:
    srv = ControlServer(
        path=short_dir / "w.sock", launcher=FakeLauncher(), controller=FakeController()
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


def _raw(path: Path, payload: bytes) -> list[dict[str, object]]:
    """Send raw bytes on a fresh connection; read response lines until the server closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return [json.loads(line) for line in data.splitlines()]


def _request(**over: object) -> LaunchRequest:
    fields: dict[str, object] = {
        "run_id": uuid7(),
        "attempt_id": uuid7(),
        "callback_sequence": 1,
        "token": "t" * 43,
        "argv": ("/bin/true",),
        "cwd": None,
        "env": {"A": "1"},
        "log_path": "/x/y.log",
        "log_quota_bytes": 10,
        "deadline_at_ms": None,
    } | over
    return LaunchRequest(**fields)  # type: ignore[arg-type]


def test_socket_is_0600_and_a_live_socket_is_never_replaced(server: ControlServer) -> None:
    assert stat.S_IMODE(os.lstat(server.path).st_mode) == 0o600
    second = ControlServer(path=server.path, launcher=FakeLauncher(), controller=FakeController())
    with pytest.raises(SocketInUse):
        second.start()
    client = WorkerClient(server.path)
    try:
        assert client.ping()["ok"] is True
    finally:
        client.close()


def test_a_stale_socket_is_replaced_but_a_regular_file_is_not(short_dir: Path) -> None:
    path = short_dir / "w.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens
    srv = ControlServer(path=path, launcher=FakeLauncher(), controller=FakeController())
    srv.start()
    client = WorkerClient(path)
    try:
        assert client.ping()["pid"] == os.getpid()
    finally:
        client.close()
        srv.close()
    assert not path.exists()  # clean shutdown removes our socket
    path.write_text("not a socket")
    srv = ControlServer(path=path, launcher=FakeLauncher(), controller=FakeController())
    with pytest.raises(SocketInUse):
        srv.start()
    assert path.read_text() == "not a socket"


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another uid")
def test_a_peer_with_another_uid_is_refused(server: ControlServer, short_dir: Path) -> None:
    # Open the file-system path so that only SO_PEERCRED stands in the way.
    os.chmod(short_dir, 0o711)
    os.chmod(server.path, 0o666)
    # A separate interpreter as "nobody" (never fork this multi-threaded test process).
    client = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "s.settimeout(10)\n"
        "s.connect(sys.argv[1])\n"
        # The server answers FORBIDDEN at once and closes: the send may meet a closed peer.
        "try:\n"
        '    s.sendall(b\'{"op":"ping"}\\n\')\n'
        "except BrokenPipeError:\n"
        "    pass\n"
        "sys.stdout.buffer.write(s.recv(4096))\n"
    )
    # The test's own interpreter may live under a 0700 home; a system one serves "nobody".
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 that an unprivileged user can run")
    result = subprocess.run(
        [python, "-I", "-S", "-c", client, str(server.path)],
        user=65534,
        group=65534,
        extra_groups=[],
        capture_output=True,
        timeout=30,
        env={},
        cwd="/",
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert json.loads(out) == {"ok": False, "error": "FORBIDDEN"}


# A socket served as the job user: it answers every line as a worker would, and writes to
# stdout what it was sent, one hex line per connection ("-" for nothing).
_IMPOSTOR = """
import os, socket, sys
path, connections = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
os.chmod(path, 0o666)
s.listen(8)
s.settimeout(30)
print("ready", flush=True)
for _ in range(connections):
    c, _ = s.accept()
    c.settimeout(2)
    got = b""
    try:
        while True:
            chunk = c.recv(65536)
            if not chunk:
                break
            got += chunk
            c.sendall(b'{"ok":true,"pid":1,"boot_id":"x","handle":{}}\\n')
    except OSError:
        pass
    c.close()
    print(got.hex() or "-", flush=True)
"""


@contextmanager
def _impostor(path: Path, connections: int) -> Iterator[subprocess.Popen[str]]:
    """The job user serving ``path`` (``_IMPOSTOR``), ready; killed by its Popen at the end
    if it has not exited."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    assert python is not None, "no system python3 that the job user can run"
    impostor = subprocess.Popen(
        [python, "-I", "-S", "-c", _IMPOSTOR, str(path), str(connections)], user=JOB_UID,
        group=JOB_UID, extra_groups=[], env={}, cwd="/", stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert impostor.stdout is not None
        assert impostor.stdout.readline() == "ready\n", impostor.stderr
        yield impostor
    finally:
        if impostor.poll() is None:
            impostor.kill()  # by its Popen, the pid this test started
            impostor.wait(timeout=10)


def test_a_socket_served_by_another_user_is_never_used(caplog: pytest.LogCaptureFixture) -> None:
    # QL_WORKER_SOCKET outside the data dir, the worker down: a job (as the job user) binds
    # that path. Before, the api's client talked to it: the pings answered, and a launch
    # handed it the run's token, argv and secrets. Now the peer's uid (SO_PEERCRED) must be
    # ours; nothing is sent, the worker counts as absent, and one line says why.
    job_user_or_skip()
    with reachable_dir() as top:
        shared = top / "sock"
        shared.mkdir()
        os.chown(shared, JOB_UID, JOB_UID)  # the job user's own, as /tmp/x would be its
        path = shared / "w.sock"
        with _impostor(path, 4) as impostor:
            client = WorkerClient(path, retries=0)
            with caplog.at_level(logging.INFO, logger="app.adapters.worker_client"):
                with pytest.raises(WorkerUnavailable) as absent:
                    client.ping(timeout_s=1.0)
                assert absent.value.reason == "WORKER_SOCKET_FOREIGN"
                with pytest.raises(WorkerUnavailable):
                    client.launch(_request(token="s" * 43, env={"SECRET": "hunter2"}))
                assert client.stop(HANDLE, grace_seconds=0.1) == "unknown"
                assert client.wake() is False
            client.close()
            out, err = impostor.communicate(timeout=30)
        assert impostor.returncode == 0, err
        # Four connections, not a byte on any: no token, argv or secret reached the job user.
        assert out.split() == ["-"] * 4
    lines = [r.getMessage() for r in caplog.records if "worker socket" in r.getMessage()]
    assert lines == [
        f"worker socket {path} is served by pid {impostor.pid} as uid {JOB_UID}, not this "
        f"service's uid {os.geteuid()}: not used, the worker counts as absent "
        "(docs/job-user.md § The worker socket)"
    ]  # one line for the four refusals
    assert not any("hunter2" in r.getMessage() or "s" * 43 in r.getMessage()
                   for r in caplog.records)  # fmt: skip


def test_a_socket_a_job_bound_while_the_worker_was_down_is_taken_back_at_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A sticky directory (/tmp-like) is allowed, and there a job may bind the socket's path
    # while the worker is down. The worker then met a live socket and refused to start
    # ("another worker answers"), so a job kept every run from starting. The peer's uid
    # tells a job from a worker: the path is taken back, with one line.
    job_user_or_skip()
    with reachable_dir() as top:
        shared = top / "tmp"
        shared.mkdir()
        os.chmod(shared, 0o1777)
        path = shared / "w.sock"
        srv = ControlServer(path=path, launcher=FakeLauncher(), controller=FakeController())
        with _impostor(path, 1) as impostor:
            with caplog.at_level(logging.WARNING, logger="app.worker.server"):
                srv.start()
            client = WorkerClient(path, retries=0)
            try:
                assert os.lstat(path).st_uid == os.geteuid()
                assert client.ping()["pid"] == os.getpid()  # ours now
            finally:
                client.close()
                srv.close()
            out, err = impostor.communicate(timeout=30)
        assert impostor.returncode == 0, err
        assert out.split() == ["-"]  # the start's probe only: not a byte was sent to it
    assert [r.getMessage() for r in caplog.records] == [
        f"worker socket {path} was served by uid {JOB_UID}, not this service's uid "
        f"{os.geteuid()} (a job may have bound it while the worker was down): replaced"
    ]


def test_framing_many_requests_per_connection_and_bad_input(server: ControlServer) -> None:
    lines = _raw(
        server.path,
        b'{"op":"ping"}\n'
        b"not json\n"
        b'{"op":"nope"}\n'
        b"[1]\n"
        b'{"op":"launch","argv":"x"}\n'
        b'{"op":"stop","handle":{},"grace_seconds":1}\n'
        b'{"op":"stop","handle":{"boot_id":"b","pid":1,"pgid":1,"start_ticks":1,'
        b'"shim_pid":1,"shim_start_ticks":1},"grace_seconds":-1}\n'
        b'{"op":"ping"}\n',
    )
    assert [line["ok"] for line in lines] == [True, False, False, False, False, False, False, True]
    assert {line.get("error") for line in lines[1:-1]} == {"BAD_REQUEST"}
    assert lines[0]["boot_id"] == current_boot_id()


def test_an_oversize_request_is_refused_and_the_connection_closed(server: ControlServer) -> None:
    lines = _raw(server.path, b"x" * (MAX_REQUEST_BYTES + 10) + b'\n{"op":"ping"}\n')
    assert lines == [{"ok": False, "error": "TOO_LARGE"}]


def test_client_maps_launch_outcomes(server: ControlServer) -> None:
    launcher: FakeLauncher = server._launcher  # type: ignore[assignment]
    client = WorkerClient(server.path)
    ok = _request()
    assert client.launch(ok) == HANDLE
    seen = launcher.calls[-1]
    assert (seen.token, seen.argv, seen.env, seen.cwd) == (ok.token, ok.argv, ok.env, None)
    rejected, failed = _request(), _request()
    launcher.outcome[rejected.attempt_id] = LaunchRejected("ALREADY_LAUNCHED")
    launcher.outcome[failed.attempt_id] = LaunchFailed("EXEC_FAILED", "EACCES")
    with pytest.raises(LaunchRejected):
        client.launch(rejected)
    with pytest.raises(LaunchFailed) as info:
        client.launch(failed)
    assert info.value.reason == "EXEC_FAILED" and not isinstance(info.value, LaunchRejected)
    assert info.value.errno_name == "EACCES"  # carried over the socket
    # What reaches the attempt's ending event is codes only, whatever a worker answers.
    odd = _request()
    launcher.outcome[odd.attempt_id] = LaunchFailed("exec of /tmp/x failed", "/tmp/x")
    with pytest.raises(LaunchFailed) as info:
        client.launch(odd)
    assert (info.value.reason, info.value.errno_name) == ("WORKER_ERROR", None)
    # The reply says when the worker committed T2 itself, and the shim's start time.
    assert client.launch_recording(_request()) == Launched(HANDLE, 123, running=False)
    recorded = _request()
    launcher.running.add(recorded.attempt_id)
    assert client.launch_recording(recorded) == Launched(HANDLE, 123, running=True)
    assert launcher.t2[-1] is True  # this client leaves T2 to the worker
    # A request without "t2" (an api that writes T2 itself) is never answered "running".
    line = {"op": "launch", **recorded.wire_fields(), "deadline_at_ms": None}
    answer = _raw(server.path, json.dumps(line).encode() + b"\n")
    assert answer[0]["ok"] is True and "running" not in answer[0]
    assert launcher.t2[-1] is False
    assert client.stop(HANDLE, grace_seconds=0.5) == "already_exited"
    controller: FakeController = server._controller  # type: ignore[assignment]
    assert controller.calls == [(HANDLE, 0.5)]
    client.close()


def test_client_is_thread_safe_and_reconnects(short_dir: Path) -> None:
    path = short_dir / "w.sock"
    srv = ControlServer(path=path, launcher=FakeLauncher(), controller=FakeController())
    srv.start()
    client = WorkerClient(path)

    def hammer() -> None:
        for _ in range(50):
            assert client.ping()["ok"] is True

    assert concurrently(8, hammer, timeout=30) == [None] * 8  # every thread, no error
    srv.close()  # every pooled connection is now broken
    with pytest.raises(WorkerUnavailable):
        client.ping()
    assert client.stop(HANDLE, grace_seconds=0) == "unknown"  # fail closed
    srv = ControlServer(path=path, launcher=FakeLauncher(), controller=FakeController())
    srv.start()
    try:
        assert client.ping()["ok"] is True
    finally:
        client.close()
        srv.close()


def test_a_launch_without_an_answer_is_never_reported_as_a_clean_failure(
    short_dir: Path,
) -> None:
    """A request that may have arrived must not become LaunchFailed (the coordinator would
    record an ending while a job might run): it is LaunchOutcomeUnknown instead."""
    path = short_dir / "mute.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    stop = threading.Event()
    answers = iter([None, None, b'{"ok":false,"error":"INTERNAL"}\n'] * 1000)

    def serve() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                data = b""
                while b"\n" not in data and (chunk := conn.recv(65536)):
                    data += chunk
                answer = next(answers)
                if answer is not None:
                    conn.sendall(answer)

    thread = threading.Thread(target=serve)
    thread.start()
    client = WorkerClient(path, read_timeout_s=0.5)
    try:
        with pytest.raises(LaunchOutcomeUnknown):
            client.launch(_request())  # closed twice without answer, then INTERNAL
        assert not issubclass(LaunchOutcomeUnknown, LaunchFailed)
        with pytest.raises(LaunchOutcomeUnknown):
            client.launch(_request())  # the same on a fresh request
    finally:
        stop.set()
        thread.join(10)
        client.close()
        listener.close()


class GatedLauncher(FakeLauncher):
    """Holds each launch until ``release`` is set (a launch still in progress)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def launch_started(self, request: LaunchRequest, *, t2: bool = False) -> Launched:
        self.entered.set()
        assert self.release.wait(10)
        return super().launch_started(request, t2=t2)


def test_a_closing_worker_refuses_new_launches_and_answers_the_one_in_progress(
    short_dir: Path,
) -> None:
    # Issue 11 §1: once shutdown began, a launch is refused before the journal (so the api
    # knows nothing spawned and requeues it), while one already in progress finishes and
    # gets its answer before the connections close.
    launcher = GatedLauncher()
    srv = ControlServer(path=short_dir / "w.sock", launcher=launcher, controller=FakeController())
    srv.start()
    first, second = WorkerClient(srv.path), WorkerClient(srv.path)
    answers: list[object] = []
    try:
        assert first.ping()["ok"] is True and second.ping()["ok"] is True  # both connected
        in_progress = threading.Thread(target=lambda: answers.append(first.launch(_request())))
        in_progress.start()
        assert launcher.entered.wait(10)
        closer = threading.Thread(target=srv.close)
        closer.start()
        deadline = threading.Event()
        while not srv._refusing and not deadline.wait(0.01):
            pass
        with pytest.raises(WorkerUnavailable) as refused:
            second.launch(_request())
        assert refused.value.reason == "WORKER_SHUTTING_DOWN"
        with pytest.raises(WorkerUnavailable):
            second.ping()  # not ready: the api's drain backs off
        assert len(launcher.calls) == 0  # the refused launch never reached the launcher
        launcher.release.set()
        in_progress.join(10)
        closer.join(10)
        assert answers == [HANDLE]  # answered, not cut off by the close
        assert not srv.path.exists()
    finally:
        launcher.release.set()
        first.close()
        second.close()
        srv.close()
