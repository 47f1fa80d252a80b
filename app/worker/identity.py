"""Durable Linux process identity and exact stop.

An identity is (boot id, pid, process group, start time in clock ticks). A pid alone is
never enough: pids are reused. Stopping opens a pidfd first and verifies the identity
*after* opening it, so every signal goes to the process that was verified (a pidfd cannot
be redirected to a process that later reuses the number).

Zombies count as exited: :func:`read_identity` returns ``None`` for them and
:func:`matches` is false.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from app.domain.execution import StopResult
from app.domain.model import ProcessHandle
from app.worker import cgroups

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
PIDFD_SIGNAL_PROCESS_GROUP = 4  # Linux 6.9: signal the process group the pidfd leads
_GROUP_POLL_SECONDS = 0.02
# Once the job's main process is gone, its shim kills the rest of the job's cgroup within
# milliseconds (and counts it): give it this long before the stop kills the rest itself.
SHIM_PATIENCE_SECONDS = 0.5


@dataclass(frozen=True)
class ProcessIdentity:
    """What the worker stores about a job so it can find, verify and stop it later."""

    boot_id: str
    pid: int
    pgid: int
    start_ticks: int

    @classmethod
    def of_job(cls, handle: ProcessHandle) -> ProcessIdentity:
        """The identity of a handle's job (its group leader), as the launch recorded it."""
        return cls(handle.boot_id, handle.pid, handle.pgid, handle.start_ticks)


@dataclass(frozen=True)
class _Stat:
    state: str
    pgid: int
    start_ticks: int


@cache
def current_boot_id() -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``), read once: it cannot change
    while this process lives."""
    with open(BOOT_ID_PATH, encoding="ascii") as fh:
        return fh.read().strip()


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the comm field, which may hold ')' and spaces
    (so index 0 is field 3, the state; 1 the ppid; 2 the pgid; 3 the session; 19 the start
    ticks); None when there is no such process. The shim keeps its own copy (it imports
    nothing from ``app``)."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2 :].split()


def _read_stat(pid: int) -> _Stat | None:
    """State, pgid (field 5) and start ticks (field 22)."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    return _Stat(fields[0].decode("ascii"), int(fields[2]), int(fields[19]))


def _alive(stat: _Stat | None) -> bool:
    return stat is not None and stat.state not in ("Z", "X", "x")


def read_identity(pid: int) -> ProcessIdentity | None:
    """The identity of the live process ``pid`` now; ``None`` if none exists or it exited."""
    stat = _read_stat(pid)
    if not _alive(stat):
        return None
    assert stat is not None
    return ProcessIdentity(current_boot_id(), pid, stat.pgid, stat.start_ticks)


def runs(pid: int, start_ticks: int) -> bool:
    """True when the process ``pid`` that started at ``start_ticks`` (this boot) is alive."""
    stat = _read_stat(pid)
    return _alive(stat) and stat is not None and stat.start_ticks == start_ticks


def _stat_matches(identity: ProcessIdentity, stat: _Stat | None) -> bool:
    return (
        _alive(stat)
        and stat is not None
        and stat.pgid == identity.pgid
        and stat.start_ticks == identity.start_ticks
    )


def matches(identity: ProcessIdentity) -> bool:
    """True when the exact process (same boot, pid, pgid, start ticks) is alive now."""
    if identity.boot_id != current_boot_id():
        return False
    return _stat_matches(identity, _read_stat(identity.pid))


def wait_pidfd(pidfd: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for the pidfd's process to exit; True when it has."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    deadline = time.monotonic() + max(timeout, 0.0)
    while True:
        remaining = deadline - time.monotonic()
        if poller.poll(max(int(remaining * 1000), 0)):
            return True
        if remaining <= 0:
            return False


def wait_exit(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``pid`` to exit (a zombie counts); True when gone."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return wait_pidfd(pidfd, timeout)
    finally:
        os.close(pidfd)


def group_alive(pgid: int) -> bool:
    """Any non-zombie process whose process group is ``pgid`` (bounded scan of /proc)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = _read_stat(int(name))
        except (OSError, ValueError):
            continue
        if stat is not None and stat.pgid == pgid and _alive(stat):
            return True
    return False


@cache
def _group_flag_supported() -> bool:
    """Probe PIDFD_SIGNAL_PROCESS_GROUP once: signal 0 through our own pidfd.

    EINVAL means the kernel does not know the flag; success or ESRCH (we do not lead a
    group, so the group named by our pid is empty) means it does.
    """
    try:
        pidfd = os.pidfd_open(os.getpid())
    except OSError:
        return False
    try:
        signal.pidfd_send_signal(pidfd, 0, None, PIDFD_SIGNAL_PROCESS_GROUP)
    except OSError as exc:
        return exc.errno != errno.EINVAL
    finally:
        os.close(pidfd)
    return True


def _verified(pidfd: int, identity: ProcessIdentity) -> bool:
    """The pidfd's process is alive and still is exactly ``identity``.

    /proc is read after the pidfd was opened; the pidfd being not yet readable afterwards
    proves the /proc entry described the pinned process, not a successor with the same pid.
    """
    if identity.boot_id != current_boot_id():
        return False
    if not _stat_matches(identity, _read_stat(identity.pid)):
        return False
    return not wait_pidfd(pidfd, 0)


def _signal_group(pidfd: int, identity: ProcessIdentity, sig: int, group_flag: bool) -> None:
    if group_flag:
        signal.pidfd_send_signal(pidfd, sig, None, PIDFD_SIGNAL_PROCESS_GROUP)
        return
    signal.pidfd_send_signal(pidfd, sig)
    os.killpg(identity.pgid, sig)


def _wait_gone(pidfd: int, pgid: int, timeout: float) -> bool:
    """Leader exited and no live member of its group remains, within ``timeout``."""
    deadline = time.monotonic() + timeout
    if not wait_pidfd(pidfd, timeout):
        return False
    while group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_GROUP_POLL_SECONDS)
    return True


def _settled(result: StopResult, cgroup: Path | None, timeout: float) -> StopResult:
    """``result``, once the job's cgroup (if any) is empty: else ``unknown``."""
    if cgroup is None:
        return result
    gone = cgroups.settle(cgroup, patience=min(SHIM_PATIENCE_SECONDS, timeout), timeout=timeout)
    return result if gone else "unknown"


def stop_identity(
    identity: ProcessIdentity,
    *,
    grace_seconds: float,
    kill_wait_seconds: float = 2.0,
    cgroup: Path | None = None,
) -> StopResult:
    """Stop exactly ``identity`` and its process group: TERM, bounded grace, re-verify, KILL.

    ``cgroup``: the job's own cgroup (checked by ``cgroups.CgroupRoot.job_dir``). It is
    killed with the group's KILL, and emptied once the leader is gone (what escaped the
    group, e.g. by ``setsid``); never while the leader lives with a changed identity.

    ``already_exited``: the process was gone or was not this identity; no signal was sent
    to it (what was left in its cgroup is killed).
    ``stopped``: signals were sent and the leader, every group member and the cgroup are gone.
    ``unknown``: it could not be established (no permission, identity changed while alive,
    still alive after the kill wait): fail closed.
    """
    if identity.pgid != identity.pid:
        return "unknown"  # jobs lead their own group; anything else is not ours to signal
    try:
        pidfd = os.pidfd_open(identity.pid)
    except ProcessLookupError:
        return _settled("already_exited", cgroup, kill_wait_seconds)
    except OSError:
        return "unknown"
    try:
        if not _verified(pidfd, identity):
            return _settled("already_exited", cgroup, kill_wait_seconds)
        group_flag = _group_flag_supported()
        try:
            _signal_group(pidfd, identity, signal.SIGTERM, group_flag)
        except ProcessLookupError:
            pass  # it exited between the check and the signal: still gone by our hand or not
        except PermissionError:
            return "unknown"
        if _wait_gone(pidfd, identity.pgid, grace_seconds):
            return _settled("stopped", cgroup, kill_wait_seconds)
        leader_alive = not wait_pidfd(pidfd, 0)
        if leader_alive and not _verified(pidfd, identity):
            return "unknown"  # alive but changed (e.g. left its group): never KILL a guess
        if not leader_alive and not group_flag and cgroup is None:
            # Without the group flag only a bare killpg remains, and the leader that pinned
            # the group number is gone: fail closed rather than signal a possible reuse.
            return "unknown"
        try:
            if leader_alive or group_flag:
                _signal_group(pidfd, identity, signal.SIGKILL, group_flag)
        except ProcessLookupError:
            pass
        except PermissionError:
            return "unknown"
        if cgroup is not None:
            cgroups.kill(cgroup)  # verified above, or its leader is gone: only this job's
        if not _wait_gone(pidfd, identity.pgid, kill_wait_seconds):
            return "unknown"
        return _settled("stopped", cgroup, kill_wait_seconds)
    finally:
        os.close(pidfd)
