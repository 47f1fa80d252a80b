"""The worker's side of the shim fork server (``shim.py --zygote``, launch-protocol.md §8).

One zygote per launcher, started lazily, talked to over an AF_UNIX socketpair. A launch sends
the spec and the write end of its status pipe and gets back the pid of the first shim process
(the zygote's child, its session leader), which stays unreaped in the zygote until
``release``: while the launcher may still kill that session, its id cannot be reused.

Access is serialized by a lock: one request/reply is the hand-over of the spec to the
zygote's spare (a fork when none is ready; either well under a millisecond of the lock for a
spec of a few KiB), and the status line is read outside it, so launches overlap.
"""

from __future__ import annotations

import array
import logging
import socket
import subprocess
import threading
import time

log = logging.getLogger(__name__)

READY = b"Z1"
START_RETRY_AFTER_S = 30.0


class ZygoteUnavailable(Exception):
    """The zygote could not be started: launch with the one-shot interpreter instead."""


class NotReceived(Exception):
    """The request certainly did not reach the zygote (it was not fully sent)."""


class Uncertain(Exception):
    """The request was sent but no reply came: the zygote may have forked."""


class ForkFailed(Exception):
    """The zygote received the request and its fork failed: nothing was started."""


class Zygote:
    """A lazily started shim fork server, restarted on demand, closed with the launcher."""

    def __init__(
        self, *, argv: list[str], reply_timeout_s: float, receipts_root: str | None = None
    ) -> None:
        # With the receipts root, each spare makes its receipt reservation there ahead of its
        # launch (launch-protocol.md §8 "Reservation made ahead").
        self._argv = [*argv, "--zygote", *([receipts_root] if receipts_root else [])]
        self._reply_timeout_s = reply_timeout_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._failed_at: float | None = None

    @property
    def pid(self) -> int | None:
        """The running zygote's pid (tests and the bench read its /proc)."""
        with self._lock:
            return self._proc.pid if self._proc is not None else None

    def spawn(self, spec: bytes, status_w: int, *, restart: bool = False) -> int:
        """Have the zygote fork the first shim process for ``spec``; its pid."""
        with self._lock:
            if restart:
                self._discard()
            sock = self._ensure()
            header = b"L" + len(spec).to_bytes(4, "big")
            fds = array.array("i", [status_w])
            try:
                sent = sock.sendmsg([header + spec], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
                if sent < len(header) + len(spec):
                    sock.sendall((header + spec)[sent:])
            except OSError:
                self._discard()
                raise NotReceived from None
            try:
                reply = _recv_exact(sock, 5)
            except (OSError, EOFError):
                self._discard()
                raise Uncertain from None
            value = int.from_bytes(reply[1:], "big")
            if reply[:1] == b"P" and value > 0:
                return value
            if reply[:1] == b"F":
                raise ForkFailed(value)
            self._discard()
            raise Uncertain

    def release(self, pid: int) -> None:
        """Let the zygote reap the first shim process ``pid`` (best effort)."""
        with self._lock:
            if self._sock is None:
                return  # that zygote is gone; its children were re-parented and reaped
            try:
                self._sock.sendall(b"R" + pid.to_bytes(4, "big"))
            except OSError:
                self._discard()

    def close(self) -> None:
        """EOF to the zygote (it exits; running shims are untouched), then reap it."""
        with self._lock:
            self._discard()

    def _ensure(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        failed_at = self._failed_at
        if failed_at is not None and time.monotonic() - failed_at < START_RETRY_AFTER_S:
            raise ZygoteUnavailable  # a start just failed: do not pay for it on every launch
        try:
            self._start()
        except (OSError, EOFError, ValueError) as exc:
            self._failed_at = time.monotonic()
            self._discard()
            log.warning("shim zygote could not be started (%s): using one-shot shims", exc)
            raise ZygoteUnavailable from None
        self._failed_at = None
        assert self._sock is not None
        return self._sock

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock = ours
            self._proc = subprocess.Popen(
                self._argv,
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                env={},  # like the one-shot shim: nothing from the service environment
                close_fds=True,
            )
        finally:
            theirs.close()
        ours.settimeout(self._reply_timeout_s)
        if _recv_exact(ours, len(READY)) != READY:
            raise ValueError("unexpected zygote greeting")

    def _discard(self) -> None:
        """Close our end (EOF ends the zygote) and reap it; kill it if it does not go."""
        sock, proc = self._sock, self._proc
        self._sock = self._proc = None
        if sock is not None:
            sock.close()
        if proc is not None:
            try:
                proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                proc.kill()  # our unreaped child: the pid is still ours to signal
                proc.wait()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("zygote closed the socket")
        buf += chunk
    return buf
