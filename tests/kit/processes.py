"""Process hygiene shared by every tier that starts real processes (the ``procs`` fixture).

Kills only by verified identity (pid and start time), never by name.
"""

from __future__ import annotations

import os
import select
import signal
import time
from pathlib import Path

import pytest

from app.domain.model import ProcessHandle
from app.worker.cgroups import AUTO, detect, settle
from app.worker.identity import ProcessIdentity, read_identity, stop_identity


def proc_state(pid: int) -> str:
    """The state letter of a process (or of a thread, by its tid), "" once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2]


def wait_all_threads_stopped(pid: int, timeout_s: float = 10.0) -> None:
    """Wait until every thread of ``pid`` is in the stopped state (``T`` in /proc)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # A thread that just exited reads "": it stops nothing.
        states = [proc_state(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")]
        if all(state in ("T", "t", "") for state in states) and any(states):
            return
        time.sleep(0.001)
    pytest.fail(f"process {pid} did not stop within {timeout_s} s of SIGSTOP")


class Processes:
    """Handles of launched jobs; everything still alive is killed by identity at teardown."""

    def __init__(self) -> None:
        self.handles: list[ProcessHandle] = []
        self.pids: list[tuple[int, int]] = []  # (pid, start_ticks) of other processes
        self.cgroups: list[str] = []  # job cgroup names whose shim the test killed

    def track(self, handle: ProcessHandle) -> ProcessHandle:
        self.handles.append(handle)
        return handle

    def track_pid(self, pid: int) -> None:
        ident = read_identity(pid)
        if ident is not None:
            self.pids.append((pid, ident.start_ticks))

    def track_cgroup(self, name: str) -> None:
        """End and remove this job cgroup at cleanup (a job no handle names)."""
        self.cgroups.append(name)

    def cleanup(self) -> None:
        root = detect(AUTO)  # where the launchers of these tests put job cgroups
        for h in self.handles:
            stop_identity(
                ProcessIdentity.of_job(h),
                grace_seconds=0.0,
                kill_wait_seconds=5.0,
            )
            kill_exact(h.shim_pid, h.shim_start_ticks)
            cgroup = None if root is None else root.job_dir(h.cgroup)
            if cgroup is not None:  # the test killed the shim: its job cgroup is ours to end
                settle(cgroup, patience=0.0, timeout=5.0)
        for pid, ticks in self.pids:
            kill_exact(pid, ticks)
        for name in self.cgroups:
            cgroup = None if root is None else root.job_dir(name)
            if cgroup is not None:  # no handle was journaled: the test names the cgroup
                settle(cgroup, patience=0.0, timeout=5.0)


def kill_exact(pid: int, start_ticks: int) -> None:
    """SIGKILL ``pid`` only if it is still the process with ``start_ticks``; wait for it."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        ident = read_identity(pid)
        if ident is not None and ident.start_ticks == start_ticks:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            select.select([pidfd], [], [], 5.0)
    except ProcessLookupError:
        pass
    finally:
        os.close(pidfd)
