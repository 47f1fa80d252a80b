"""Client of the worker's control socket: the api's Launcher and ProcessController.

Each new connection is used only if the process serving the socket runs as this process's
own user (``SO_PEERCRED``): a socket path outside the data dir may be bound by a job (as the
job user) while the worker is down, and the requests carry tokens, argv and secrets. Such a
socket is a worker that is absent (``WORKER_SOCKET_FOREIGN``), said in one log line.

Thread-safe: each call borrows one connection from a small pool (a connection carries one
request at a time) and returns it after a complete answer. A connection that broke is
dropped and the request is sent again on a fresh one: ping and stop are safe to repeat, and
launch is too, because the worker's journal turns a repeated launch into "the first handle"
(docs/design.md §3.9); while the first launch is still in flight the repeat is retried briefly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

from app.domain.errors import (
    LaunchFailed,
    LaunchOutcomeUnknown,
    LaunchRejected,
    WorkerUnavailable,
)
from app.domain.execution import Launched, LaunchRequest, StopResult
from app.domain.model import ProcessHandle

MAX_RESPONSE_BYTES = 1 << 20
_POOL_MAX = 4
_ERRNO_NAME = re.compile(r"E[A-Z0-9]{1,15}")  # what a launch failure may carry as its errno
_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")  # what its reason may be
_STOP_EXTRA_S = 15.0  # the worker's stop may take grace + its own bounded kill wait
_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}
FOREIGN_LOG_EVERY_S = 60.0  # a drain asks again at its backoff: one line a minute at most
log = logging.getLogger(__name__)


# The worker's refusals of a launch it did not journal: it has begun shutting down, or it
# does not surely hold its lease (docs/worker-lease.md). Nothing was spawned: unavailable.
SHUTTING_DOWN = "WORKER_SHUTTING_DOWN"
LEASE_LOST = "WORKER_LEASE_LOST"
# The socket is served by a process of another user: never talked to (nothing sent).
SOCKET_FOREIGN = "WORKER_SOCKET_FOREIGN"


class _Broken(Exception):
    """The connection failed; ``sent`` tells whether the request may have arrived."""

    def __init__(self, sent: bool) -> None:
        super().__init__("broken")
        self.sent = sent


class WorkerClient:
    """Launcher + ProcessController over the worker socket, plus ``ping``."""

    def __init__(
        self,
        socket_path: Path | str,
        *,
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 30.0,
        retries: int = 2,
    ) -> None:
        self.path = str(socket_path)
        self._connect_timeout = connect_timeout_s
        self._read_timeout = read_timeout_s
        self._retries = retries
        self._lock = threading.Lock()
        self._idle: list[tuple[socket.socket, bytearray]] = []
        self._closed = False
        self._foreign_logged: tuple[int, float] | None = None  # (peer uid, when) of the line

    # -- ports ---------------------------------------------------------------------------

    def ping(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """``{"ok": true, "pid", "boot_id"}`` from the worker; WorkerUnavailable otherwise.

        With ``timeout_s``: one try that waits at most that long for the answer (readiness).
        """
        req = {"op": "ping"}
        if timeout_s is None:
            resp = self._call_retrying(req, self._read_timeout)
        else:
            try:
                resp = self._call(req, timeout_s)
            except _Broken:
                raise WorkerUnavailable("WORKER_NO_ANSWER") from None
        if resp.get("ok") is not True:
            raise WorkerUnavailable(str(resp.get("error") or "INTERNAL"))
        return resp

    def launch(self, request: LaunchRequest) -> ProcessHandle:
        """Launch through the worker; the handle of ``launch_recording``."""
        return self.launch_recording(request).handle

    def launch_recording(self, request: LaunchRequest) -> Launched:
        """Launch through the worker: the handle, the job's start as its shim reported it,
        and whether the worker committed T2 with it (docs/design.md §3.7).

        Raises: WorkerUnavailable (nothing was delivered, or the worker refused it unjournaled:
        nothing spawned), LaunchRejected (the attempt is journaled or fenced already),
        LaunchFailed(reason) (the spawn failed), LaunchOutcomeUnknown (delivered, no answer).
        """
        req = {
            "op": "launch",
            **request.wire_fields(),
            "deadline_at_ms": request.deadline_at_ms,
            "t2": "worker",  # this api writes no T2 when the answer says ``running``
        }
        repeated = False
        deadline = time.monotonic() + self._read_timeout
        while True:
            try:
                resp = self._call(req, self._read_timeout)
            except WorkerUnavailable:
                if repeated:
                    raise LaunchOutcomeUnknown("WORKER_NO_ANSWER") from None
                raise  # nothing was ever sent: a clean launch failure
            except _Broken as exc:
                # The launch may have reached the worker: ask again, the journal answers.
                repeated = repeated or exc.sent
                if time.monotonic() >= deadline:
                    if not repeated:
                        raise WorkerUnavailable("WORKER_UNAVAILABLE") from None
                    raise LaunchOutcomeUnknown("WORKER_NO_ANSWER") from None
                continue
            if resp.get("ok") is True:
                try:
                    handle = ProcessHandle.from_dict(resp["handle"])
                except (KeyError, TypeError, ValueError):
                    raise LaunchOutcomeUnknown("BAD_RESPONSE") from None
                started = resp.get("started_at_ms")
                if type(started) is not int or started <= 0:
                    started = None
                return Launched(handle, started, resp.get("running") is True)
            error = str(resp.get("error") or "INTERNAL")
            if error in (SHUTTING_DOWN, LEASE_LOST):
                if repeated:  # our first try may have been journaled before the refusal
                    raise LaunchOutcomeUnknown("WORKER_NO_ANSWER")
                raise WorkerUnavailable(error)
            if error == "ALREADY_LAUNCHED":
                reason = resp.get("reason")
                if repeated and reason == "LAUNCH_IN_FLIGHT" and time.monotonic() < deadline:
                    time.sleep(0.05)  # our first try may still be in flight in the worker
                    continue
                raise LaunchRejected(reason if isinstance(reason, str) else error)
            if error == "INTERNAL":
                raise LaunchOutcomeUnknown(error)  # fail closed: the journal decides later
            # Both end up on the attempt's ending event: codes only, whatever a worker sends.
            if _CODE.fullmatch(error) is None:
                error = "WORKER_ERROR"
            errno_name = resp.get("errno")
            valid = isinstance(errno_name, str) and _ERRNO_NAME.fullmatch(errno_name) is not None
            raise LaunchFailed(error, errno_name if valid else None)

    def stop(self, handle: ProcessHandle, *, grace_seconds: float) -> StopResult:
        """Stop the exact identity through the worker; ``unknown`` if it cannot tell."""
        req = {"op": "stop", "handle": handle.to_dict(), "grace_seconds": grace_seconds}
        try:
            resp = self._call_retrying(req, self._read_timeout + grace_seconds + _STOP_EXTRA_S)
        except (WorkerUnavailable, _Broken):
            return "unknown"
        result = resp.get("result")
        if resp.get("ok") is True and result in ("stopped", "already_exited", "unknown"):
            return result  # type: ignore[no-any-return]
        return "unknown"

    def wake(self, *, reconcile: bool = False) -> bool:
        """Ask the worker to sweep cancel intents now (and reconcile too); False if it can't.

        Only a nudge: the intent is already committed, and the worker's own periodic sweep
        acts on it anyway, so an unreachable worker is not an error for the caller.
        """
        req: dict[str, Any] = {"op": "wake"}
        if reconcile:
            req["reconcile"] = True
        try:
            resp = self._call_retrying(req, self._read_timeout)
        except (WorkerUnavailable, _Broken):
            return False
        return resp.get("ok") is True

    def close(self) -> None:
        """Close pooled connections."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for sock, _ in idle:
            sock.close()

    # -- transport -------------------------------------------------------------------------

    def _call_retrying(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        for attempt in range(self._retries + 1):
            try:
                return self._call(req, timeout)
            except _Broken:
                if attempt == self._retries:
                    raise WorkerUnavailable("WORKER_NO_ANSWER") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _call(self, req: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One request/response; _Broken on a failed connection, WorkerUnavailable if none."""
        data = json.dumps(req, separators=(",", ":")).encode("utf-8") + b"\n"
        sock, buf = self._borrow()
        ok = False
        try:
            try:
                sock.settimeout(timeout)
                sock.sendall(data)
            except OSError:
                raise _Broken(sent=False) from None
            try:
                while b"\n" not in buf:
                    chunk = sock.recv(65536)
                    if not chunk:
                        raise _Broken(sent=True)
                    buf += chunk
                    if len(buf) > MAX_RESPONSE_BYTES:
                        raise _Broken(sent=True)
            except OSError:
                raise _Broken(sent=True) from None
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            try:
                resp = json.loads(line)
            except ValueError:
                raise _Broken(sent=True) from None
            if not isinstance(resp, dict):
                raise _Broken(sent=True)
            ok = True
            return resp
        finally:
            if ok:
                self._give_back(sock, buf)
            else:
                sock.close()

    def _borrow(self) -> tuple[socket.socket, bytearray]:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(self._connect_timeout)
        try:
            sock.connect(self.path)
            pid, uid = _peer(sock)
        except OSError:
            sock.close()
            raise WorkerUnavailable("WORKER_UNAVAILABLE") from None
        if uid != os.geteuid():
            # Not our worker: a job (or any other user) bound the path, e.g. one outside the
            # data dir while the worker was down. Not a byte is sent to it; the caller sees
            # an absent worker (a drain backs off, a launch requeues: docs/job-user.md).
            sock.close()
            self._log_foreign(pid, uid)
            raise WorkerUnavailable(SOCKET_FOREIGN)
        return sock, bytearray()

    def _log_foreign(self, pid: int, uid: int) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._foreign_logged
            if last is not None and last[0] == uid and now - last[1] < FOREIGN_LOG_EVERY_S:
                return
            self._foreign_logged = (uid, now)
        log.error(
            "worker socket %s is served by pid %d as uid %d, not this service's uid %d: not "
            "used, the worker counts as absent (docs/job-user.md § The worker socket)",
            self.path, pid, uid, os.geteuid(),
        )  # fmt: skip

    def _give_back(self, sock: socket.socket, buf: bytearray) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < _POOL_MAX and not buf:
                self._idle.append((sock, buf))
                return
        with contextlib.suppress(OSError):
            sock.close()


def _peer(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process that serves the connected ``sock`` (``SO_PEERCRED``: the
    credentials it had when it called ``listen``, which the serving process cannot forge)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, _gid = _UCRED.unpack(raw)
    return int(pid), int(uid)
