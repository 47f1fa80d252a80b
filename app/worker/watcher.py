"""Live completion: notice when a shim exits and tell the completion service.

One thread, one epoll set of pidfds (one per running shim) plus a wake-up pipe. A pidfd is
opened on the shim's pid and the shim's identity (boot id, start ticks) is verified *after*
opening it, so the fd can only ever refer to our shim, never to a process that reused its
pid. The shim exits only after it published the receipt (or failed to), so its exit is the
moment to consume. Missed or failed notifications are the reconciler's business
(docs/design.md §3.13): this is the fast path, never the only path.

With ``lanes``, the callbacks run on that many threads instead of the watcher's own: on
PostgreSQL a completion is a dozen round trips and a WAL flush, and one thread doing them
in turn kept every run active (and so counted by QL_MAX_RUNNING) until the endings before
it were recorded; on SQLite endings that meet share one synced commit (group commit,
app/storage/uow.py), which one thread taking them in turn never allows. Each shim exits
once and its fd is dropped before the callback is queued, so no attempt is handed out
twice; exactly-once is the completion transaction's anyway.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import threading
import time
from collections.abc import Callable

from app.domain.model import ProcessHandle
from app.worker.identity import current_boot_id, read_identity, wait_pidfd

log = logging.getLogger(__name__)

ShimExitCallback = Callable[[str, str], object]


def shim_alive(handle: ProcessHandle) -> bool:
    """True when the handle's shim (same boot, pid and start ticks) is alive now."""
    current = read_identity(handle.shim_pid)
    return (
        current is not None
        and current.start_ticks == handle.shim_start_ticks
        and handle.boot_id == current_boot_id()
    )


class ShimWatcher:
    """Calls ``on_shim_exit(run_id, attempt_id)`` once per watched shim when it exits."""

    def __init__(self, on_shim_exit: ShimExitCallback, *, lanes: int = 0) -> None:
        self._on_exit = on_shim_exit
        self._endings: queue.SimpleQueue[tuple[str, str] | None] = queue.SimpleQueue()
        self._lanes = [
            threading.Thread(target=self._lane, name=f"ql-complete-{i}", daemon=True)
            for i in range(lanes)
        ]
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._lock = threading.Lock()
        self._by_fd: dict[int, tuple[str, str]] = {}
        self._by_attempt: dict[str, int] = {}
        self._pending: list[tuple[str, str]] = []  # exited before they could be watched
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="shim-watcher", daemon=True)

    def start(self) -> None:
        """Start the watcher thread (and its lanes)."""
        for lane in self._lanes:
            lane.start()
        self._thread.start()

    def watching(self) -> int:
        """How many shims are watched now."""
        with self._lock:
            return len(self._by_fd)

    def add(self, run_id: str, attempt_id: str, handle: ProcessHandle) -> None:
        """Watch the attempt's shim; if it is already gone, the callback runs soon anyway."""
        with self._lock:
            if self._stopping or attempt_id in self._by_attempt:
                return
            pidfd = self._open_verified(handle)
            if pidfd is None:
                self._pending.append((run_id, attempt_id))
            else:
                self._by_fd[pidfd] = (run_id, attempt_id)
                self._by_attempt[attempt_id] = pidfd
                self._epoll.register(pidfd, select.EPOLLIN)
        self._wake()

    @staticmethod
    def _open_verified(handle: ProcessHandle) -> int | None:
        try:
            pidfd = os.pidfd_open(handle.shim_pid)
        except OSError:
            return None
        # Verified after opening: the pidfd then pins exactly the shim that was checked.
        if not shim_alive(handle) or wait_pidfd(pidfd, 0):
            os.close(pidfd)
            return None
        return pidfd

    def stop(self, timeout: float = 5.0) -> None:
        """Stop watching (shims and jobs keep running) and join the threads, all within
        ``timeout``: an ending queued and not begun is left to the reconciler, one in
        progress may finish meanwhile (a completion stuck on the database never holds the
        worker's shutdown, and so its lease, past the timeout)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._stopping = True
        self._wake()
        for _ in self._lanes:
            self._endings.put(None)
        threads = [self._thread, *self._lanes]
        for thread in threads:
            if thread.is_alive():
                thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            # Still polling: closing the epoll under it would make it raise. The fds go
            # with the process, which is shutting down.
            log.warning("shim watcher did not stop in time")
            return
        with self._lock:
            for fd in list(self._by_fd):
                os.close(fd)
            self._by_fd.clear()
            self._by_attempt.clear()
        self._epoll.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _lane(self) -> None:
        while True:
            ending = self._endings.get()
            if ending is None:
                return
            if not self._stopping:  # after stop() only the sentinel matters
                self._exited(*ending)

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a full pipe means already awake
            os.write(self._wake_w, b"x")

    def _loop(self) -> None:
        while True:
            events = self._epoll.poll()
            exited: list[tuple[str, str]] = []
            with self._lock:
                if self._stopping:
                    return
                for fd, _mask in events:
                    if fd == self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            while os.read(self._wake_r, 512):
                                pass
                        continue
                    ids = self._by_fd.pop(fd, None)
                    if ids is None:
                        continue
                    self._epoll.unregister(fd)
                    os.close(fd)
                    self._by_attempt.pop(ids[1], None)
                    exited.append(ids)
                exited += self._pending
                self._pending = []
            for run_id, attempt_id in exited:
                if self._lanes:
                    self._endings.put((run_id, attempt_id))
                else:
                    self._exited(run_id, attempt_id)

    def _exited(self, run_id: str, attempt_id: str) -> None:
        try:
            self._on_exit(run_id, attempt_id)
        except Exception as exc:  # the reconciler will retry; never content in logs
            log.warning("completion after shim exit failed: %s", type(exc).__name__)
