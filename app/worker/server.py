"""The worker's control socket: newline-delimited JSON over a 0600 Unix socket.

One request per line, one response line per request, many requests per connection. The
peer's uid (SO_PEERCRED) must equal ours, otherwise the connection gets one FORBIDDEN line
and is closed. Requests carry secrets (token, env, argv): they are never logged; errors
carry stable codes only. Ops (``api-schemas/worker-socket.md``):

* ``{"op":"ping"}`` → ``{"ok":true,"pid":..,"boot_id":..,"instance_id":..,"epoch":..,
  "process_limit":{..}}`` (the lease this worker holds, how its process limit holds), or
  ``{"ok":false,"error":"WORKER_LEASE_LOST"}`` once that lease is no longer surely held
  (docs/several-hosts.md: an api dispatches only through a live worker of its own host)
* ``{"op":"launch", <LaunchRequest fields>[,"t2":"worker"]}`` →
  ``{"ok":true,"handle":{..},"started_at_ms":..}``, plus ``"running":true`` when the request
  asked for it and the worker committed T2 with the handle (docs/design.md §3.7)
  or ``{"ok":false,"error":"ALREADY_LAUNCHED"|"EXEC_FAILED"|"BAD_REQUEST"|..}``

Once the worker has begun shutting down (``close``), ping and launch answer
``{"ok":false,"error":"WORKER_SHUTTING_DOWN"}``: a refused launch was never journaled, so
the caller knows nothing spawned (it requeues the run); launches already in progress finish
and are answered before the connections close.
* ``{"op":"stop","handle":{..},"grace_seconds":x}`` → ``{"ok":true,"result":..}``
* ``{"op":"wake"}`` (optional ``"reconcile":true``) → ``{"ok":true}``: run the cancellation
  sweep now (after the api committed a cancel intent), or a full reconcile pass too
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import stat
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from app.domain.errors import LaunchFailed, LaunchRejected
from app.domain.execution import LEFTOVERS, Launched, LaunchRequest, Leftovers, StopResult
from app.domain.model import ProcessHandle
from app.storage.durable import CANNOT_MAKE
from app.worker.identity import current_boot_id

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 1 << 20
MAX_GRACE_SECONDS = 300.0
_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}
_LAUNCH_STR = ("run_id", "attempt_id", "token", "log_path")
SHUTTING_DOWN = {"ok": False, "error": "WORKER_SHUTTING_DOWN"}


class WorkerLauncher(Protocol):
    """What the server needs from the launcher."""

    def launch_started(self, request: LaunchRequest, *, t2: bool = False) -> Launched:
        """Start once or raise LaunchFailed; the handle, the shim-reported start time, and
        whether T2 was committed with the handle (only when ``t2``: the caller asked)."""
        ...


class WorkerController(Protocol):
    """What the server needs to stop a process by identity."""

    def stop(self, handle: ProcessHandle, *, grace_seconds: float) -> StopResult:
        """Exact-identity stop."""
        ...


class BadRequest(Exception):
    """The request line is not a valid request (a stable code, no content)."""


class SocketInUse(RuntimeError):
    """Another process answers on the socket path."""


def _bind(path: Path) -> socket.socket:
    """Bind and listen at ``path`` created 0600; replace a stale socket only if dead.

    Raises: SocketInUse; OSError (CANNOT_MAKE: a full disk or a read-only mount)."""
    if path.exists() or path.is_symlink():
        st = os.lstat(path)
        if not stat.S_ISSOCK(st.st_mode):
            raise SocketInUse(f"{path} exists and is not a socket; refusing to replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            _replace(path, "stale: nobody listens")
        except OSError as exc:
            code = errno.errorcode.get(exc.errno or 0, "error")
            raise SocketInUse(
                f"cannot probe {path} (uid {st.st_uid}'s socket): {code}; remove it as that "
                "user or root, or keep QL_WORKER_SOCKET in the data dir"
            ) from None
        else:
            uid = peer_uid(probe)
            if uid == os.geteuid():
                raise SocketInUse(f"another worker answers on {path}")
            # A job (the job user) bound the path while the worker was down: not a worker.
            # The api never uses it (its client checks the peer too); take the path back.
            _replace(path, f"served by uid {uid}, not this service's user")
            log.warning(
                "worker socket %s was served by uid %d, not this service's uid %d (a job may "
                "have bound it while the worker was down): replaced", path, uid, os.geteuid(),
            )  # fmt: skip
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket file is born 0600: no window with wider access
    try:
        sock.bind(str(path))
    except OSError as exc:
        # Taken again between the removal and the bind, or a directory not ours to write.
        sock.close()
        if exc.errno in CANNOT_MAKE:
            # Said as the start's CannotMake line (app/context/worker_process.py), not as
            # a socket in use.
            raise
        code = errno.errorcode.get(exc.errno or 0, "error")
        raise SocketInUse(f"cannot bind the worker socket {path}: {code}") from None
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(64)
    return sock


def _replace(path: Path, why: str) -> None:
    """Remove a socket file that is not a live worker's, or say in one line why not."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except PermissionError:
        # Another user's file in a sticky directory (/tmp): only its owner may remove it.
        try:
            owner = f"uid {os.lstat(path).st_uid}"
        except OSError:
            owner = "another user"
        raise SocketInUse(
            f"{path} ({why}) belongs to {owner} and this user may not remove it: remove it as "
            "that user or root, or keep QL_WORKER_SOCKET in the data dir (docs/job-user.md § "
            "The worker socket)"
        ) from None


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end (SO_PEERCRED)."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    return int(_UCRED.unpack(raw)[1])


def _str(req: dict[str, Any], key: str) -> str:
    value = req.get(key)
    if not isinstance(value, str) or "\x00" in value:
        raise BadRequest(key)
    return value


def _int(req: dict[str, Any], key: str, *, optional: bool = False) -> int | None:
    value = req.get(key)
    if value is None and optional:
        return None
    if type(value) is not int or value < 0:
        raise BadRequest(key)
    return value


def parse_launch(req: dict[str, Any]) -> LaunchRequest:
    """A LaunchRequest from a request object; BadRequest on any wrong type."""
    strs = {k: _str(req, k) for k in _LAUNCH_STR}
    argv = req.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise BadRequest("argv")
    env = req.get("env")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise BadRequest("env")
    cwd = req.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise BadRequest("cwd")
    sequence = _int(req, "callback_sequence")
    quota = _int(req, "log_quota_bytes")
    assert sequence is not None and quota is not None
    leftovers: Leftovers = req.get("leftovers", "kill")  # absent: an api older than the field
    if leftovers not in LEFTOVERS:
        raise BadRequest("leftovers")
    run_as = req.get("run_as")
    if run_as is not None and (not isinstance(run_as, str) or not run_as):
        raise BadRequest("run_as")
    return LaunchRequest(
        run_id=strs["run_id"],
        attempt_id=strs["attempt_id"],
        callback_sequence=sequence,
        token=strs["token"],
        argv=tuple(argv),
        cwd=cwd,
        env=dict(env),
        log_path=strs["log_path"],
        log_quota_bytes=quota,
        deadline_at_ms=_int(req, "deadline_at_ms", optional=True),
        leftovers=leftovers,
        run_as=run_as,
    )


class ControlServer:
    """Serves the control socket; a thread per connection."""

    def __init__(
        self,
        *,
        path: Path,
        launcher: WorkerLauncher,
        controller: WorkerController,
        on_wake: Callable[[bool], None] | None = None,
        lease_facts: Callable[[], dict[str, Any] | None] | None = None,
        facts: dict[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        # What this worker decided at its start and ``ping`` tells the api (its process
        # limit, shown by /readyz): fixed for its lifetime.
        self._facts = dict(facts or {})
        # The held lease's instance and epoch for ``ping``; None while it is not surely held.
        self._lease_facts = lease_facts
        self._on_wake = on_wake
        self._launcher = launcher
        self._controller = controller
        self._sock: socket.socket | None = None
        self._inode: int | None = None
        self._conns: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)
        self._busy = 0  # requests read and not yet answered
        self._refusing = False  # set once shutdown began: no new launch is taken
        self._closing = threading.Event()
        self._accept_thread: threading.Thread | None = None
        self._boot_id = current_boot_id()

    def start(self) -> None:
        """Bind the socket and start accepting."""
        self._sock = _bind(self.path)
        self._inode = os.lstat(self.path).st_ino
        self._accept_thread = threading.Thread(target=self._accept, name="ctl-accept", daemon=True)
        self._accept_thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Refuse new launches, let requests in progress answer (bounded by ``timeout``), then
        stop accepting, end every connection, join threads, remove our socket file."""
        with self._lock:
            self._refusing = True
            self._answered.wait_for(lambda: self._busy == 0, timeout)
        self._closing.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        with self._lock:
            for conn in self._conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            threads = list(self._threads)
        if self._accept_thread is not None:
            self._accept_thread.join(timeout)
        for thread in threads:
            thread.join(timeout)
        with contextlib.suppress(OSError):
            if self._inode is not None and os.lstat(self.path).st_ino == self._inode:
                os.unlink(self.path)

    def _accept(self) -> None:
        assert self._sock is not None
        while not self._closing.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._closing.is_set():
                    return
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            with self._lock:
                if self._closing.is_set():
                    conn.close()
                    return
                self._conns.add(conn)
                self._threads.add(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if peer_uid(conn) != os.geteuid():
                conn.sendall(b'{"ok":false,"error":"FORBIDDEN"}\n')
                return
            buf = b""
            while not self._closing.is_set():
                while b"\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                    if len(buf) > MAX_REQUEST_BYTES and b"\n" not in buf:
                        conn.sendall(b'{"ok":false,"error":"TOO_LARGE"}\n')
                        return
                line, buf = buf.split(b"\n", 1)
                if len(line) > MAX_REQUEST_BYTES:
                    conn.sendall(b'{"ok":false,"error":"TOO_LARGE"}\n')
                    return
                with self._lock:
                    self._busy += 1
                try:
                    response = self.handle_line(line)
                    conn.sendall(json.dumps(response, separators=(",", ":")).encode() + b"\n")
                finally:
                    with self._lock:
                        self._busy -= 1
                        self._answered.notify_all()
        except OSError:
            return  # the peer went away or we are closing
        finally:
            with self._lock:
                self._conns.discard(conn)
                self._threads.discard(threading.current_thread())
            conn.close()

    def handle_line(self, line: bytes) -> dict[str, Any]:
        """Answer one request line (never raises, never echoes the request)."""
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise BadRequest("not an object")
            op = req.get("op")
            if op == "ping":
                if self._refusing:
                    return dict(SHUTTING_DOWN)
                answer = {"ok": True, "pid": os.getpid(), "boot_id": self._boot_id}
                answer |= self._facts
                if self._lease_facts is not None:
                    facts = self._lease_facts()
                    if facts is None:
                        return {"ok": False, "error": "WORKER_LEASE_LOST"}
                    answer |= facts
                return answer
            if op == "launch":
                # ``"t2":"worker"``: the api leaves T2 to us (an older one writes it itself,
                # and a T2 written here too would make it stop the job as a failed T2).
                return self._launch(parse_launch(req), t2=req.get("t2") == "worker")
            if op == "stop":
                return self._stop(req)
            if op == "wake":
                return self._wake(req)
            raise BadRequest("op")
        except (BadRequest, ValueError, RecursionError):
            return {"ok": False, "error": "BAD_REQUEST"}
        except Exception as exc:
            log.error("control request failed: %s", type(exc).__name__)
            return {"ok": False, "error": "INTERNAL"}

    def _launch(self, request: LaunchRequest, *, t2: bool) -> dict[str, Any]:
        if self._refusing:
            return dict(SHUTTING_DOWN)  # before the journal: provably nothing spawned
        try:
            launched = self._launcher.launch_started(request, t2=t2)
        except LaunchRejected as exc:
            return {"ok": False, "error": "ALREADY_LAUNCHED", "reason": exc.reason}
        except LaunchFailed as exc:
            failed: dict[str, Any] = {"ok": False, "error": exc.reason}
            if exc.errno_name:
                failed["errno"] = exc.errno_name
            return failed
        answer = {"ok": True, "handle": launched.handle.to_dict()}
        answer["started_at_ms"] = launched.started_at_ms
        if launched.running:
            answer["running"] = True  # T2 is committed: the caller writes nothing more
        return answer

    def _wake(self, req: dict[str, Any]) -> dict[str, Any]:
        reconcile = req.get("reconcile", False)
        if not isinstance(reconcile, bool):
            raise BadRequest("reconcile")
        if self._on_wake is None:
            return {"ok": False, "error": "UNSUPPORTED"}
        self._on_wake(reconcile)
        return {"ok": True}

    def _stop(self, req: dict[str, Any]) -> dict[str, Any]:
        raw = req.get("handle")
        grace = req.get("grace_seconds")
        if not isinstance(raw, dict) or type(grace) not in (int, float) or isinstance(grace, bool):
            raise BadRequest("stop")
        assert isinstance(grace, int | float)
        if not 0 <= grace <= MAX_GRACE_SECONDS:
            raise BadRequest("grace_seconds")
        handle = ProcessHandle.from_dict(raw)
        return {"ok": True, "result": self._controller.stop(handle, grace_seconds=float(grace))}
