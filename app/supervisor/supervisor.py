"""The ``qinglong serve`` supervisor: runs the api and the worker, restarts them, reaps orphans.

One thread, one loop: signals arrive as bytes on a wakeup pipe (``signal.set_wakeup_fd``), so
no work happens inside a signal handler. Each service child leads its own process group (a
terminal Ctrl-C reaches only the supervisor, which forwards it) and gets ``PDEATHSIG=TERM``
(if the supervisor is killed outright, the services stop instead of holding the port).

The supervisor is a child subreaper: job shims double-fork out of the worker and are
re-parented here. It reaps them when they exit and never signals them; on shutdown they keep
running and the worker reconciles them at its next start (docs/design.md §2.6, §3.13).

Shutdown stops the services one after another, in the order they are given (``qinglong
serve``: the api, then the worker): each gets TERM, KILL to its group after
``stop_timeout_s``, and is reaped before the next one is told to stop. The api stops
dispatching and lets its in-flight launches finish before it exits, so the worker is still
there to answer them (docs/rolling-restarts.md, Shutdown order).

A service leader's exit is observed with ``waitid(WNOWAIT)`` first: while it is an unreaped
zombie its pid, and so its process-group number, cannot be reused, which makes the
``killpg(KILL)`` of the group's stragglers (orphaned uvicorn workers) exact.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from app.settings import SERVICE_START_ENV
from app.worker.identity import group_alive

log = logging.getLogger("qinglong.supervisor")

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)
_TICK_S = 1.0
_WAIT_TICK_S = 0.1  # how often a before_stop wait is looked at
_KILL_WAIT_S = 10.0


@dataclass(frozen=True)
class BackoffPolicy:
    """Restart delays: ``base_s`` doubling up to ``cap_s``; reset after ``healthy_after_s``."""

    base_s: float = 0.5
    cap_s: float = 30.0
    healthy_after_s: float = 60.0


def next_restart(
    failures: int, lived_s: float, policy: BackoffPolicy = BackoffPolicy()
) -> tuple[int, float]:
    """After an exit: the new consecutive-failure count and the delay before the restart.

    A child that lived ``healthy_after_s`` or longer starts the count again at one.
    """
    count = 1 if lived_s >= policy.healthy_after_s else max(failures, 0) + 1
    delay = policy.base_s * float(2 ** min(count - 1, 32))
    return count, min(delay, policy.cap_s)


@dataclass(frozen=True)
class ServiceSpec:
    """A supervised role: its name and the command that runs it."""

    name: str
    argv: Sequence[str]
    # SIGHUP reloads this role (the api; never the worker): forwarded to the child when it
    # handles it itself (uvicorn's multiprocess manager replaces its workers one by one,
    # each new one serving before the old one stops), otherwise the child is restarted.
    reloads: bool = False
    forwards_hup: bool = False
    # Exit statuses that a restart cannot cure (the worker lease held by another worker):
    # the supervisor stops every service and exits with that status instead.
    fatal_exit_codes: frozenset[int] = frozenset()
    # Called once an orderly stop reaches this service, before its SIGTERM, with its pid,
    # while it still runs (``serve --stop-jobs-on-exit``: the jobs are stopped while the
    # worker records their endings). What it returns is waited for, in the loop (signals
    # still handled), until done or past its deadline; then the SIGTERM.
    before_stop: Callable[[int], StopWait | None] | None = None


class StopWait(Protocol):
    """What a service's ``before_stop`` began; the stop waits for it (bounded)."""

    deadline: float  # monotonic: the stop goes on then, done or not

    def done(self) -> bool:
        """True once what began is over."""

    def close(self, *, finished: bool) -> None:
        """The wait is over (``finished``: ``done`` said so; else the deadline, a second
        signal, or the service's exit): release what it holds, say what became of it."""


@dataclass
class _Service:
    spec: ServiceSpec
    pid: int | None = None
    last_pgid: int | None = None
    started_at: float = 0.0
    failures: int = 0
    restart_at: float | None = 0.0  # monotonic time of the next start; None: do not start
    restart_now: bool = False  # the next exit was asked for (SIGHUP): restart at once
    stop_deadline: float | None = None  # shutdown: TERM sent; KILL to the group after this
    killed: bool = False
    before_stop_called: bool = False
    waiting: StopWait | None = None  # what before_stop began, until it is over
    starts: int = 0  # in this supervisor's lifetime, told to the child (SERVICE_START_ENV)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc().prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def become_subreaper() -> None:
    """Adopt orphaned descendants (job shims, orphaned uvicorn workers) so they are reaped."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


JOBS_KEEP_RUNNING = "jobs keep running"


@dataclass
class Supervisor:
    """Starts the services, keeps them up, and stops them on SIGTERM/SIGINT."""

    services: Sequence[ServiceSpec]
    env: Mapping[str, str]
    policy: BackoffPolicy = field(default_factory=BackoffPolicy)
    stop_timeout_s: float = 15.0
    # What becomes of the jobs once the services stopped, for the stop's log line.
    jobs_on_stop: str = JOBS_KEEP_RUNNING
    _children: list[_Service] = field(default_factory=list, init=False)
    _stopping: bool = field(default=False, init=False)
    _exit_code: int = field(default=0, init=False)

    def run(self) -> int:
        """Supervise until told to stop; 0 after an orderly stop, else a fatal exit status."""
        become_subreaper()
        self._children = [_Service(spec) for spec in self.services]
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        previous = {sig: signal.signal(sig, _noop) for sig in _HANDLED}
        old_fd = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        try:
            self._loop(wake_r)
        finally:
            signal.set_wakeup_fd(old_fd)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(wake_r)
            os.close(wake_w)
        return self._exit_code

    # -- the loop -----------------------------------------------------------------------

    def _loop(self, wake_r: int) -> None:
        while True:
            self._reap()
            now = time.monotonic()
            if self._stopping:
                child = next((c for c in self._children if c.pid is not None), None)
                if child is None:
                    self._drain_groups()
                    log.info("all services stopped")
                    return
                if not self._stop_step(child, now):
                    return
                if child.stop_deadline is None:  # waiting for its before_stop
                    timeout = _WAIT_TICK_S
                else:
                    timeout = max(min(child.stop_deadline - now, _TICK_S), 0.05)
            else:
                self._start_due(now)
                timeout = self._next_timeout(now)
            readable, _, _ = select.select([wake_r], [], [], timeout)
            if readable:
                self._handle_signals(_drain(wake_r))

    def _next_timeout(self, now: float) -> float:
        due = [c.restart_at for c in self._children if c.pid is None and c.restart_at is not None]
        if not due:
            return _TICK_S
        return max(min(min(due) - now, _TICK_S), 0.0)

    def _handle_signals(self, signums: bytes) -> None:
        for signum in signums:
            if signum in (signal.SIGTERM, signal.SIGINT):
                self._begin_stop(signal.Signals(signum).name)
            elif signum == signal.SIGHUP and not self._stopping:
                self._reload()

    # -- starting -----------------------------------------------------------------------

    def _start_due(self, now: float) -> None:
        for child in self._children:
            if child.pid is None and child.restart_at is not None and child.restart_at <= now:
                self._start(child)

    def _start(self, child: _Service) -> None:
        env = {**self.env, SERVICE_START_ENV: str(child.starts + 1)}
        try:
            child.pid = spawn_in_own_group(child.spec.argv, env)
        except OSError as exc:  # e.g. EAGAIN from fork: retry later, keep the other one up
            child.failures, delay = next_restart(child.failures, 0.0, self.policy)
            child.restart_at = time.monotonic() + delay
            log.error("%s could not be started (%s); retry in %.1f s", child.spec.name, exc, delay)
            return
        child.starts += 1
        child.last_pgid = child.pid
        child.started_at = time.monotonic()
        child.restart_at = None
        child.restart_now = False
        log.info("%s started (pid %d)", child.spec.name, child.pid)

    # -- exits and reaping --------------------------------------------------------------

    def _reap(self) -> None:
        """Reap every exited child; a service leader's group is emptied before it is reaped."""
        leaders = {c.pid: c for c in self._children if c.pid is not None}
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == 0:
                return
            pid = info.si_pid
            child = leaders.pop(pid, None)
            if child is not None:
                _killpg(pid, signal.SIGKILL)  # stragglers only: the leader is a zombie
            try:
                _, status = os.waitpid(pid, 0)
            except ChildProcessError:
                continue
            if child is not None:
                self._on_exit(child, status)

    def _on_exit(self, child: _Service, status: int) -> None:
        child.pid = None
        self._end_wait(child, finished=False)
        code = os.waitstatus_to_exitcode(status)
        what = f"signal {signal.Signals(-code).name}" if code < 0 else f"status {code}"
        lived = time.monotonic() - child.started_at
        if self._stopping:
            # The end this stop asked for (its TERM, a KILL after the grace, or a clean exit)
            # is "stopped": "exited (signal SIGTERM)" read as a failure after an orderly stop.
            asked = code in (0, -signal.SIGTERM, -signal.SIGKILL)
            log.info("%s %s (%s)", child.spec.name, "stopped" if asked else "exited", what)
            if code in child.spec.fatal_exit_codes:
                self._exit_code = code  # refused during the stop: still what serve says
            return
        if code in child.spec.fatal_exit_codes:
            log.error("%s exited (%s): a restart cannot help", child.spec.name, what)
            self._exit_code = code
            # A fatal exit (another worker holds the lease): serve stops no job then.
            self._begin_stop(f"{child.spec.name} {what}", jobs=JOBS_KEEP_RUNNING)
            return
        if child.restart_now:
            child.restart_at = time.monotonic()
            log.info("%s exited (%s); restarting now (reload)", child.spec.name, what)
            return
        child.failures, delay = next_restart(child.failures, lived, self.policy)
        child.restart_at = time.monotonic() + delay
        log.warning(
            "%s exited (%s) after %.1f s; restart in %.1f s", child.spec.name, what, lived, delay
        )

    # -- reload and stop ----------------------------------------------------------------

    def _reload(self) -> None:
        for child in self._children:
            if not child.spec.reloads:
                continue
            if child.pid is None:
                child.restart_at = time.monotonic()
                log.info("SIGHUP: %s is down; starting it now", child.spec.name)
            elif child.spec.forwards_hup:
                log.info("SIGHUP: rolling restart of the %s workers", child.spec.name)
                os.kill(child.pid, signal.SIGHUP)
            else:
                log.info("SIGHUP: restarting %s", child.spec.name)
                child.restart_now = True
                os.kill(child.pid, signal.SIGTERM)

    def _begin_stop(self, reason: str, *, jobs: str | None = None) -> None:
        if self._stopping:
            log.warning("%s again: killing the services now", reason)
            for child in self._children:
                if child.pid is not None and not child.killed:
                    self._kill(child, time.monotonic())
            return
        self._stopping = True
        log.info("%s: stopping the services in order (%s)", reason, jobs or self.jobs_on_stop)
        for child in self._children:
            child.restart_at = None

    def _stop_step(self, child: _Service, now: float) -> bool:
        """Advance the stop of ``child``, the first one still up; False: give up waiting."""
        assert child.pid is not None
        if child.stop_deadline is None:
            if child.spec.before_stop is not None and not child.before_stop_called:
                child.before_stop_called = True
                try:
                    child.waiting = child.spec.before_stop(child.pid)
                except Exception as exc:  # the stop goes on: what it left is settled later
                    log.warning("before stopping %s: %s", child.spec.name, type(exc).__name__)
            if child.waiting is not None:
                try:
                    finished = child.waiting.done()
                except Exception:  # a failed look is not "done": the deadline still holds
                    finished = False
                if not finished and now < child.waiting.deadline:
                    return True  # the loop goes on: signals and exits are still handled
                self._end_wait(child, finished=finished)
                now = time.monotonic()
            log.info("stopping %s", child.spec.name)
            child.stop_deadline = now + self.stop_timeout_s
            os.kill(child.pid, signal.SIGTERM)
        elif now >= child.stop_deadline + _KILL_WAIT_S:
            log.error("%s did not exit even after SIGKILL; leaving it", child.spec.name)
            return False
        elif now >= child.stop_deadline and not child.killed:
            log.warning("%s did not stop in time; killing its process group", child.spec.name)
            self._kill(child, now)
        return True

    @staticmethod
    def _end_wait(child: _Service, *, finished: bool) -> None:
        waiting, child.waiting = child.waiting, None
        if waiting is not None:
            try:
                waiting.close(finished=finished)
            except Exception as exc:
                log.warning("before stopping %s: %s", child.spec.name, type(exc).__name__)

    def _kill(self, child: _Service, now: float) -> None:
        assert child.pid is not None
        self._end_wait(child, finished=False)
        child.killed = True
        child.stop_deadline = min(child.stop_deadline or now, now)
        _killpg(child.pid, signal.SIGKILL)  # unreaped leader: the number is ours

    def _drain_groups(self) -> None:
        """Wait (bounded) until no process is left in a service's group, reaping as we go."""
        deadline = time.monotonic() + 5.0
        pgids = [c.last_pgid for c in self._children if c.last_pgid]
        while any(group_alive(g) for g in pgids) and time.monotonic() < deadline:
            for g in pgids:
                _killpg(g, signal.SIGKILL)
            time.sleep(0.02)
            self._reap()


def _noop(_signum: int, _frame: object) -> None:
    """Python-level handler; the wakeup pipe carries the signal number to the loop."""


def _drain(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 512)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def spawn_in_own_group(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Fork and exec ``argv`` as the leader of a new process group, with PDEATHSIG=TERM."""
    parent = os.getpid()
    everything = set(signal.valid_signals())
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, everything)
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child execs or exits
            _exec_child(parent, list(argv), dict(env))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    try:
        os.setpgid(pid, pid)  # also done by the child: whichever runs first wins
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.ESRCH):
            raise
    return pid


def _exec_child(parent: int, argv: list[str], env: dict[str, str]) -> None:  # pragma: no cover
    code = 127
    try:  # any exception ends here: os._exit in ``finally`` discards it
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        for sig in (*_HANDLED, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            code = 1  # the supervisor died before PDEATHSIG was armed
            return
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        os.execve(argv[0], argv, env)  # noqa: S606 - argv is ours, never a shell
    finally:
        os._exit(code)
