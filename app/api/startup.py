"""An api that cannot start exits, non-zero, with one line that says why.

``qinglong api`` runs the app under uvicorn: with ``--workers 1`` in its own process, with
more under uvicorn's multiprocess manager, each worker a spawned process that imports the
app, calls the factory and runs the lifespan. When that start fails (a broken install: a
module that does not import, a database driver that does not load; anything the lifespan
raises), every worker fails the same way, and a restart of the worker alone cannot help.
uvicorn left it as a traceback per worker, then, with ``--workers 2`` or more, restarted a
worker whose import failed forever (the port bound, nothing served), or stopped after its
health ping's 30 s wait and exited 0, which a supervisor reads as an orderly stop.

Here the factory (``serve_app``) and the lifespan hand what they raised to ``fail``, which
makes it one line (the exception's type, its words for an import or an OS error, and where
it was raised; never a traceback, which may quote SQL parameters or a URL) and ends the
process at once with ``STARTUP_FAILURE``. A spawned worker does not print it: it sends the
line to the manager (``ApiManager``) through a pipe that travels with uvicorn's config
(``ApiConfig``), and the manager stops the other workers and ends the api, so the line is
said once, by ``qinglong api`` (``ApiManager.failure``). That is while no worker has
served: after, a worker that cannot start is logged and tried again after a backoff, and
the others serve on (``after_exit``). The manager also stops waiting on
a worker that has exited, where uvicorn's ping waited its whole timeout (30 s here).

A database that does not answer is not such a failure: the lifespan does not need it, the
api serves, and each request says 503 ``DATABASE_UNREACHABLE`` until it answers. See
docs/operations.md §5 and docs/rolling-restarts.md.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from socket import socket
from typing import Any, NoReturn

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from app.api.start_failure import EXIT_CANNOT_START, cannot_start

log = logging.getLogger("qinglong.api")

# How long the manager waits for the other workers to stop once one could not start: they
# are starting too (or serving their last requests), never more than uvicorn's graceful
# shutdown and the lifespan's close; then they are killed.
STOP_OTHERS_S = 12.0
_POLL_S = 0.1
# Once the api has served, a worker that cannot start is started again after this long,
# doubling to the most (as `qinglong serve` backs off a service), per slot (``Backoffs``); a
# worker that serves in the slot resets it.
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0
# How long a worker's failed start waits for the others to say whether one serves already.
ASK_OTHERS_S = 1.0
# Where this process's start failure goes: the manager's pipe in a spawned worker (set by
# ``ApiConfig.load``), else ``_say`` (``qinglong api --workers 1``: its refusal line).
_reports: Connection | None = None
_say: Callable[[str], None] = lambda line: print(f"qinglong: {line}", file=sys.stderr)  # noqa: E731


def say_with(say: Callable[[str], None]) -> None:
    """How an api process of its own (``--workers 1``) says its one line."""
    global _say
    _say = say


def serve_app() -> Any:
    """The factory uvicorn calls: ``app.api.main.serve_app``, imported here so that a module
    that does not import is one line too, not uvicorn's traceback (and, with several
    workers, not a worker restarted forever)."""
    try:
        from app.api.main import serve_app as build

        return build()
    except Exception as exc:
        fail(exc)


def fail(exc: BaseException) -> NoReturn:
    """End this api process, which could not start, with one line naming ``exc``."""
    line = cannot_start(exc)
    sent = False
    if _reports is not None:
        try:
            _reports.send(report(os.getpid(), line))
            sent = True
        except (OSError, ValueError):
            pass  # the manager is gone: say it here
    if not sent:
        _say(line)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Not SystemExit: uvicorn would log it with a traceback, and the lifespan's close would
    # run on a context that was never built. Nothing of this process served.
    os._exit(EXIT_CANNOT_START)


def report(pid: int, line: str) -> tuple[int, str]:
    """What a worker sends the manager: ``(pid, line)``, pickled to at most ``PIPE_BUF``
    bytes. Every worker writes to one pipe, and only a write of up to ``PIPE_BUF`` bytes is
    atomic: a longer one could interleave with another worker's and garble both. The line
    of ``fail`` is ``REASON_MAX`` characters and a prefix, at most about 2,100 bytes of
    UTF-8, so this only checks (and, were it ever longer, shortens) it."""
    while len(_framed(pid, line)) > select.PIPE_BUF:
        line = line[: len(line) * 3 // 4] + "…"
    return pid, line


def _framed(pid: int, line: str) -> bytes:
    """The bytes ``Connection.send`` writes for ``(pid, line)``: a 4-byte length, then the
    pickle (one write, for a message of up to 16 KiB)."""
    return b"1234" + bytes(ForkingPickler.dumps((pid, line)))


class ApiConfig(uvicorn.Config):
    """uvicorn's config, carrying the write end of the manager's pipe into each worker
    (uvicorn pickles the config into every worker it spawns)."""

    def __init__(self, *args: Any, reports: Connection | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reports = reports

    def load(self) -> None:
        global _reports
        _reports = self.reports
        super().load()


def after_exit(code: int | None, *, was_ready: bool, api_served: bool) -> str:
    """What the manager does about a worker that exited with status ``code`` (negative: the
    signal that ended it): ``"restart"`` a worker that served (killed: started again at
    once, as uvicorn does); ``"end"`` the api when the worker never served and no worker of
    this api ever has, and it could not start (``STARTUP_FAILURE``, its line sent) or died
    by a signal (killed mid-start: an OOM killer, a crash in a driver's C code, which would
    recur at each try); else ``"retry"``: a worker that never served is started again after
    a backoff, while the others serve on (one lost worker is not an outage). ``code`` None:
    a worker that did not answer its health ping in time (killed by the manager, not dead of
    its own), restarted or retried, never the end by itself. Once every worker waits for its
    retry, the manager ends the api all the same (``keep_subprocess_alive``)."""
    if was_ready:
        return "restart"
    if not api_served and code is not None and (code == STARTUP_FAILURE or code < 0):
        return "end"
    return "retry"


class Backoffs:
    """The wait before a slot's next worker, when the last could not start: ``RETRY_FIRST_S``
    doubling to ``RETRY_MAX_S``, one per slot, so a slot whose workers serve does not cut
    short the wait of one whose workers always fail."""

    def __init__(self) -> None:
        self._next: dict[int, float] = {}

    def next(self, slot: int) -> float:
        wait = self._next.get(slot, RETRY_FIRST_S)
        self._next[slot] = min(wait * 2, RETRY_MAX_S)
        return wait

    def reset(self, slot: int) -> None:
        self._next.pop(slot, None)


def exit_line(code: int | None) -> str:
    """The line of a worker that exited before serving, when it sent none."""
    if code is not None and code < 0:
        return f"an api worker exited by signal {-code} before serving"
    return f"an api worker could not start (exit status {code})"


class ApiManager(Multiprocess):
    """uvicorn's multiprocess manager, except that a worker that could not start, before any
    worker of the api served, ends it (``after_exit``).

    ``failure`` is the line a worker sent (or, for a worker that exited with uvicorn's
    ``STARTUP_FAILURE`` or by a signal without one, a line that says so); the other workers
    are stopped and ``run`` returns. Once a worker has served (answered uvicorn's health
    ping with its server started; the others are asked again when a line arrives), a worker
    that cannot start is logged with its line and started again after its slot's backoff
    (``Backoffs``), while the others serve on. A worker started by a rolling restart
    (SIGHUP) that cannot start is not one of ``processes`` yet: uvicorn keeps the old one
    serving, and its line is logged.
    A worker that dies after it served (killed) is restarted at once, as uvicorn does.
    """

    def __init__(self, config: ApiConfig, sockets: list[socket], reports: Connection) -> None:
        super().__init__(config, sockets)
        self.reports = reports
        self.failure: str | None = None
        self.served = False  # some worker of this api has served
        self._ready: set[Process] = set()  # workers that served
        self._lines: dict[int, str] = {}  # what a worker that could not start sent, by pid
        self._retry_at: dict[Process, float] = {}  # a worker that exited: when to replace it
        self._backoff = Backoffs()  # by slot (index in ``processes``)
        self._asked: set[Process] = set()  # pinged, the answer not read yet

    def keep_subprocess_alive(self) -> None:
        if self.should_exit.is_set() or self._failed():
            return
        live = set(self.processes)  # forget those a rolling restart replaced
        self._ready &= live
        self._asked &= live
        self._retry_at = {p: at for p, at in self._retry_at.items() if p in live}
        for idx, process in enumerate(self.processes):
            if process in self._retry_at:  # exited before serving: replaced after a backoff
                if time.monotonic() >= self._retry_at[process]:
                    del self._retry_at[process]
                    self.processes[idx] = self._start()
                continue
            if self._answers(process):
                continue
            if self._failed():
                return
            hung = process.process.is_alive()  # no answer to the ping: not a death of its own
            process.kill()  # hung (or gone): make sure
            process.join()
            if self.should_exit.is_set():
                return
            code, pid = (None if hung else process.exitcode), process.pid
            line = self._lines.pop(pid or 0, None) or (
                f"an api worker did not answer its health ping in "
                f"{self.config.timeout_worker_healthcheck} s" if hung else exit_line(code)
            )
            decided = after_exit(code, was_ready=process in self._ready, api_served=self.served)
            self._ready.discard(process)
            if decided == "end":
                self._fail(line)
                return
            if decided == "restart":
                log.warning("api worker [%s] died (status %s); starting another", pid, code)
                self.processes[idx] = self._start()
                continue
            if all(p in self._retry_at or p is process for p in self.processes):
                # No worker left serving, and the last could not start: the port would stay
                # bound with nothing behind it, and a unit would never restart the api.
                self._fail(f"no api worker is left: {line}")
                return
            wait = self._backoff.next(idx)
            log.error("api worker [%s]: %s; another in %.1f s", pid, line, wait)
            self._retry_at[process] = time.monotonic() + wait

    def _start(self) -> Process:
        process = Process(self.config, self.sockets)
        process.start()
        return process

    def join_all(self) -> None:
        if self.failure is None:
            super().join_all()
            return
        deadline = time.monotonic() + STOP_OTHERS_S
        for process in self.processes:
            process.process.join(max(deadline - time.monotonic(), 0.0))
            if process.process.exitcode is None:
                process.kill()
                process.process.join()

    def _answers(self, process: Process) -> bool:
        """uvicorn's health ping, given up as soon as the worker exits or one reports a
        failed start (uvicorn's waited its whole timeout for a worker that had exited). A
        worker answers whether its server has started: the first that has, has served."""
        if not process.process.is_alive():
            return False
        try:
            deadline = time.monotonic() + self.config.timeout_worker_healthcheck
            while time.monotonic() < deadline:
                started = self._ask(process, _POLL_S)
                if started is not None:
                    if started:
                        self._serves(process)
                    return True
                if not process.process.is_alive():
                    return False
                if self.reports.poll() and self._failed():
                    return False  # the api ends: this answer no longer matters
        except (OSError, EOFError, pickle.UnpicklingError):
            return False
        return False

    def _ask(self, process: Process, wait_s: float) -> bool | None:
        """Whether ``process``'s server has started, or None when it has not answered within
        ``wait_s``. One ping at a time: a ping not answered yet is waited on, not sent again,
        so an answer is never read as the answer to a later ping."""
        if process not in self._asked:
            process.parent_conn.send(b"ping")
            self._asked.add(process)
        if not process.parent_conn.poll(wait_s):
            return None
        self._asked.discard(process)
        return process.parent_conn.recv() is True

    def _serves(self, process: Process) -> None:
        if process not in self._ready:  # a new worker serves: its slot's backoff is over
            self._ready.add(process)
            self.served = True
            self._backoff.reset(self.processes.index(process))

    def _another_serves(self, pid: int) -> bool:
        """Whether a worker other than ``pid`` has started serving, asked now. The pings of
        ``keep_subprocess_alive`` come every half second: a worker that started since the
        last one has served all the same, and one that cannot start is then retried, not the
        end of the api."""
        deadline = time.monotonic() + ASK_OTHERS_S
        for process in self.processes:
            if process.pid == pid or not process.process.is_alive():
                continue
            try:
                started = self._ask(process, _POLL_S)
                while started is None and time.monotonic() < deadline:
                    if not process.process.is_alive():  # its end of the pipe stays open
                        break
                    started = self._ask(process, _POLL_S)
            except (OSError, EOFError, pickle.UnpicklingError):
                continue
            if started:
                self._serves(process)
                return True
        return False

    def _failed(self) -> bool:
        """Read the workers' lines; True once one of ours could not start before any
        worker served."""
        ours = {p.pid for p in self.processes}
        try:
            while self.reports.poll():
                pid, line = self.reports.recv()
                if pid not in ours:  # a rolling restart's new worker: uvicorn keeps the old one
                    log.error("api worker [%s] of a rolling restart: %s", pid, line)
                elif self.failure is not None:
                    pass  # the api ends already, with the first line
                elif self.served or self._another_serves(pid):
                    self._lines[pid] = line  # said with the backoff once its exit is seen
                else:
                    self._fail(line)
        except (OSError, EOFError, pickle.UnpicklingError):
            pass
        return self.failure is not None

    def _fail(self, line: str) -> None:
        if self.failure is None:
            self.failure = line
        self.should_exit.set()
