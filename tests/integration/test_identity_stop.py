"""Durable process identity and exact stop, against real processes.

Jobs are started by the test as children in their own process group (like the shim does).
Every child is reaped, and anything still alive at teardown is killed by pidfd.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import IO

import pytest

from app.domain.ids import uuid7
from app.domain.model import ProcessHandle
from app.supervisor import stop_jobs
from app.worker import cgroups
from app.worker import identity as ident_mod
from app.worker.identity import (
    ProcessIdentity,
    current_boot_id,
    matches,
    read_identity,
    stop_identity,
    wait_exit,
    wait_pidfd,
)

DEADLINE = 20.0


class Children:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pidfds: list[int] = []

    def start(
        self, script: str, *, own_group: bool = True
    ) -> tuple[subprocess.Popen[bytes], ProcessIdentity]:
        return self.spawn(["/bin/sh", "-c", script], own_group=own_group)

    def spawn(
        self, argv: list[str], *, own_group: bool = True
    ) -> tuple[subprocess.Popen[bytes], ProcessIdentity]:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            process_group=0 if own_group else None,
        )
        self.procs.append(proc)
        ident = read_identity(proc.pid)
        assert ident is not None
        return proc, ident

    def pidfd(self, pid: int) -> int:
        fd = os.pidfd_open(pid)
        self.pidfds.append(fd)
        return fd

    def cleanup(self) -> None:
        for fd in self.pidfds:  # grandchildren: pinned before the test touched them
            try:
                if not wait_pidfd(fd, 0):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    wait_pidfd(fd, 5.0)
            except ProcessLookupError:
                pass
            os.close(fd)
        for proc in self.procs:
            if proc.stdin is not None:
                proc.stdin.close()
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=DEADLINE)
            if proc.stdout is not None:
                _pending.pop(proc.stdout.fileno(), None)
                proc.stdout.close()


@pytest.fixture
def children() -> Iterator[Children]:
    tracker = Children()
    try:
        yield tracker
    finally:
        tracker.cleanup()


_pending: dict[int, bytes] = {}


def read_line(stream: IO[bytes] | None) -> bytes:
    """One line from a child's stdout, unbuffered, within a bounded deadline."""
    assert stream is not None
    fd = stream.fileno()
    deadline = time.monotonic() + DEADLINE
    buf = _pending.pop(fd, b"")
    while b"\n" not in buf:
        remaining = deadline - time.monotonic()
        assert remaining > 0, "child did not report in time"
        if select.select([fd], [], [], remaining)[0]:
            chunk = os.read(fd, 4096)
            assert chunk, "child closed its output"
            buf += chunk
    line, rest = buf.split(b"\n", 1)
    if rest:
        _pending[fd] = rest
    return line.strip()


def test_read_identity_and_matches(children: Children) -> None:
    proc, ident = children.start("echo ready; exec sleep 60")
    assert read_line(proc.stdout) == b"ready"
    assert ident.boot_id == current_boot_id()
    assert ident.pid == ident.pgid == proc.pid
    assert ident.start_ticks > 0
    assert matches(ident)
    assert not matches(replace(ident, start_ticks=ident.start_ticks + 1))
    assert not matches(replace(ident, pgid=ident.pgid + 1))
    assert not matches(replace(ident, boot_id="00000000-0000-0000-0000-000000000000"))


def test_zombie_counts_as_exited(children: Children) -> None:
    proc, ident = children.start("read _; exit 0")
    assert proc.stdin is not None
    proc.stdin.close()  # let it exit now that its identity is recorded
    assert wait_exit(proc.pid, DEADLINE)  # exited, not yet reaped: a zombie
    assert os.path.exists(f"/proc/{proc.pid}")
    assert read_identity(proc.pid) is None
    assert not matches(ident)
    assert stop_identity(ident, grace_seconds=1.0) == "already_exited"
    assert proc.wait(timeout=DEADLINE) == 0


def test_term_respecting_job_is_stopped_within_grace(children: Children) -> None:
    proc, ident = children.start("echo ready; exec sleep 60")
    assert read_line(proc.stdout) == b"ready"
    started = time.monotonic()
    assert stop_identity(ident, grace_seconds=10.0) == "stopped"
    assert time.monotonic() - started < 5.0
    assert proc.wait(timeout=DEADLINE) == -signal.SIGTERM


def test_term_ignoring_job_is_killed(children: Children) -> None:
    proc, ident = children.start("trap '' TERM; echo ready; while :; do sleep 0.05; done")
    assert read_line(proc.stdout) == b"ready"
    started = time.monotonic()
    assert stop_identity(ident, grace_seconds=0.3, kill_wait_seconds=DEADLINE) == "stopped"
    assert time.monotonic() - started >= 0.3
    assert proc.wait(timeout=DEADLINE) == -signal.SIGKILL


@pytest.mark.parametrize(
    "mutation",
    [
        {"start_ticks": 1},  # the pid was reused by another process
        {"boot_id": "00000000-0000-0000-0000-000000000000"},
    ],
)
def test_mismatched_identity_sends_no_signal(
    children: Children, mutation: dict[str, object]
) -> None:
    # A TERM would end it at once, so "still alive and output still flowing" proves no signal.
    proc, ident = children.start("echo ready; exec sleep 60")
    assert read_line(proc.stdout) == b"ready"
    wrong = replace(ident, **mutation)  # type: ignore[arg-type]
    if "start_ticks" in mutation:
        wrong = replace(ident, start_ticks=ident.start_ticks + 1)
    assert stop_identity(wrong, grace_seconds=0.2) == "already_exited"
    assert proc.poll() is None
    assert matches(ident)


def test_process_that_is_not_the_recorded_group_leader_gets_no_signal(
    children: Children,
) -> None:
    # Same pid and start ticks, but it is in our process group, not one it leads: a stored
    # identity claiming pgid == pid no longer describes it, so nothing may be signalled
    # (a group TERM here would hit this very test process).
    proc, ident = children.start("echo ready; exec sleep 60", own_group=False)
    assert read_line(proc.stdout) == b"ready"
    assert ident.pgid == os.getpgid(0) != proc.pid
    claimed = replace(ident, pgid=proc.pid)
    assert not matches(claimed)
    assert stop_identity(claimed, grace_seconds=0.2) == "already_exited"
    assert proc.poll() is None and matches(ident)


def test_pid_reuse_simulation_leaves_real_process_alive(children: Children) -> None:
    proc, ident = children.start(
        "trap 'echo got-term' TERM; echo ready; while :; do sleep 0.05; done"
    )
    assert read_line(proc.stdout) == b"ready"
    stale = ProcessIdentity(ident.boot_id, ident.pid, ident.pgid, ident.start_ticks - 1)
    assert stop_identity(stale, grace_seconds=0.2, kill_wait_seconds=0.2) == "already_exited"
    assert matches(ident) and proc.poll() is None
    # Nothing was delivered: the trap never printed. Now stop it for real and see the trap.
    assert stop_identity(ident, grace_seconds=0.3, kill_wait_seconds=DEADLINE) == "stopped"
    proc.wait(timeout=DEADLINE)
    assert read_line(proc.stdout) == b"got-term"


def test_exited_pid_returns_already_exited(children: Children) -> None:
    proc, ident = children.start("read _; exit 0")
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(timeout=DEADLINE) == 0  # reaped: the pid no longer exists
    assert read_identity(ident.pid) is None
    assert stop_identity(ident, grace_seconds=1.0) == "already_exited"


def test_grandchildren_in_the_group_die_too(children: Children) -> None:
    proc, ident = children.start("sleep 60 & echo $!; sleep 60 & echo $!; echo ready; wait")
    grandchildren = [int(read_line(proc.stdout)), int(read_line(proc.stdout))]
    assert read_line(proc.stdout) == b"ready"
    fds = [children.pidfd(pid) for pid in grandchildren]
    assert all(os.getpgid(pid) == ident.pgid for pid in grandchildren)
    assert stop_identity(ident, grace_seconds=5.0) == "stopped"
    assert all(wait_pidfd(fd, DEADLINE) for fd in fds)
    proc.wait(timeout=DEADLINE)


def test_term_ignoring_grandchild_is_killed_after_leader_exits(children: Children) -> None:
    if not ident_mod._group_flag_supported():
        pytest.skip("kernel lacks PIDFD_SIGNAL_PROCESS_GROUP")
    proc, ident = children.start(
        "sh -c 'trap \"\" TERM; echo $$; echo ready; exec sleep 60' & wait"
    )
    grandchild = int(read_line(proc.stdout))
    assert read_line(proc.stdout) == b"ready"
    fd = children.pidfd(grandchild)
    assert stop_identity(ident, grace_seconds=0.3, kill_wait_seconds=DEADLINE) == "stopped"
    assert wait_pidfd(fd, DEADLINE)
    assert proc.wait(timeout=DEADLINE) == -signal.SIGTERM


def test_non_leader_identity_is_unknown_without_signal(children: Children) -> None:
    proc, ident = children.start("echo ready; exec sleep 60")
    assert read_line(proc.stdout) == b"ready"
    odd = replace(ident, pgid=ident.pgid + 1)
    assert stop_identity(odd, grace_seconds=0.1) == "unknown"
    assert matches(ident)


def test_wait_exit_times_out_on_live_process(children: Children) -> None:
    proc, ident = children.start("echo ready; exec sleep 60")
    assert read_line(proc.stdout) == b"ready"
    started = time.monotonic()
    assert wait_exit(ident.pid, 0.1) is False
    assert time.monotonic() - started >= 0.1


# ---- a job whose identity changes during the grace (docs/design.md §3.10) ---------------

# On SIGTERM the job moves itself into the decoy's process group (same session: both are
# children of this test), so after the grace its pgid no longer matches the stored identity.
_MOVES_TO_DECOY = """
import os, signal, sys, time
decoy = int(sys.argv[1])
def moved(*_):
    os.setpgid(0, decoy)
    print("moved", flush=True)
signal.signal(signal.SIGTERM, moved)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def _cgroup_root_or_skip() -> cgroups.CgroupRoot:
    root = cgroups.detect(cgroups.AUTO)
    if root is None:
        pytest.skip("no writable cgroup v2 hierarchy here (QL_CGROUP_ROOT auto found none)")
    return root


@pytest.fixture
def job_cgroup() -> Iterator[Callable[[int], Path]]:
    """Make a job cgroup as the shim would (``ql-<uuid7>`` under the root) and move ``pid``
    into it; every cgroup made is emptied and removed at teardown."""
    made: list[Path] = []

    def make(pid: int) -> Path:
        root = _cgroup_root_or_skip()
        path = root.path / f"{cgroups.PREFIX}{uuid7()}"
        path.mkdir()
        made.append(path)
        (path / "cgroup.procs").write_text(str(pid))
        checked = root.job_dir(path.name)
        assert checked == path
        return path

    try:
        yield make
    finally:
        for path in made:
            assert cgroups.settle(path, patience=0.0, timeout=DEADLINE)
            assert not path.exists()


@pytest.mark.parametrize("group_flag", [True, False], ids=["group-flag", "no-group-flag"])
@pytest.mark.parametrize("in_cgroup", [False, True], ids=["group", "cgroup"])
def test_job_that_changes_group_during_the_grace_is_unknown_and_nothing_is_killed(
    children: Children,
    job_cgroup: Callable[[int], Path],
    monkeypatch: pytest.MonkeyPatch,
    group_flag: bool,
    in_cgroup: bool,
) -> None:
    if group_flag and not ident_mod._group_flag_supported():
        pytest.skip("kernel lacks PIDFD_SIGNAL_PROCESS_GROUP")
    monkeypatch.setattr(ident_mod, "_group_flag_supported", lambda: group_flag)
    decoy, _ = children.start("echo ready; exec sleep 60")
    assert read_line(decoy.stdout) == b"ready"
    job, ident = children.spawn([sys.executable, "-c", _MOVES_TO_DECOY, str(decoy.pid)])
    assert read_line(job.stdout) == b"ready"
    cgroup = job_cgroup(job.pid) if in_cgroup else None  # the decoy stays outside it

    # The grace covers the job's handler running its setpgid on a loaded host.
    result = stop_identity(ident, grace_seconds=1.0, kill_wait_seconds=0.5, cgroup=cgroup)

    assert read_line(job.stdout) == b"moved"
    assert result == "unknown"  # alive with a changed identity: never a KILL on a guess
    assert os.getpgid(job.pid) == decoy.pid
    assert job.poll() is None and decoy.poll() is None
    assert matches(replace(ident, pgid=decoy.pid))  # the very same process, untouched


# ---- the job's own cgroup (docs/leftovers.md) --------------------------------------------


def test_stop_kills_what_escaped_the_group_into_a_new_session(
    children: Children, job_cgroup: Callable[[int], Path]
) -> None:
    proc, ident = children.start("read _; setsid sleep 60 & echo $!; echo ready; exec sleep 60")
    cgroup = job_cgroup(proc.pid)
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.flush()  # only now fork the escapee: it is born in the job's cgroup
    escapee = int(read_line(proc.stdout))
    assert read_line(proc.stdout) == b"ready"
    fd = children.pidfd(escapee)
    deadline = time.monotonic() + DEADLINE
    while os.getsid(escapee) != escapee:  # $! is known before the child ran setsid()
        assert time.monotonic() < deadline, "the escapee never left the job's session"
        time.sleep(0.01)
    assert stop_identity(ident, grace_seconds=5.0, cgroup=cgroup) == "stopped"
    assert wait_pidfd(fd, DEADLINE), "the setsid escapee survived the stop"
    assert not cgroup.exists()  # emptied and removed by the stop
    assert proc.wait(timeout=DEADLINE) == -signal.SIGTERM


def test_stop_of_an_exited_job_still_ends_its_cgroup(
    children: Children, job_cgroup: Callable[[int], Path]
) -> None:
    # The shim died with the job's main process: only the cgroup still knows the leftover.
    proc, ident = children.start("read _; setsid sleep 60 & echo $!; exit 0")
    cgroup = job_cgroup(proc.pid)
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    leftover = int(read_line(proc.stdout))
    fd = children.pidfd(leftover)
    assert proc.wait(timeout=DEADLINE) == 0
    assert stop_identity(ident, grace_seconds=1.0, cgroup=cgroup) == "already_exited"
    assert wait_pidfd(fd, DEADLINE)
    assert not cgroup.exists()


def test_job_cgroup_names_are_checked_before_use(tmp_path: Path) -> None:
    root = cgroups.CgroupRoot(tmp_path)
    good = f"{cgroups.PREFIX}{uuid7()}"
    (tmp_path / good).mkdir()
    os.symlink(tmp_path / good, tmp_path / f"{cgroups.PREFIX}{(linked := uuid7())}")
    (tmp_path / f"{cgroups.PREFIX}{(plain := uuid7())}").write_text("")
    assert root.job_dir(good) == tmp_path / good
    assert root.job_dir(f"{cgroups.PREFIX}{linked}") is None  # a symlink
    assert root.job_dir(f"{cgroups.PREFIX}{plain}") is None  # not a directory
    assert root.job_dir(f"{cgroups.PREFIX}{uuid7()}") is None  # absent
    for bad in (None, good[len(cgroups.PREFIX) :], "ql-../x", f"ql-{uuid7()}/..", "ql-x"):
        assert root.job_dir(bad) is None


def test_stop_jobs_neither_signals_nor_waits_for_a_process_recorded_in_another_boot(
    children: Children,
) -> None:
    # After a reboot a stored handle's pids may belong to strangers, start ticks and all:
    # the boot id is what says they are not ours. A wait for the "shim" here would last the
    # whole shim wait, since the stranger lives on.
    proc, ident = children.start("echo ready; exec sleep 60")
    assert read_line(proc.stdout) == b"ready"
    foreign = ProcessHandle(
        boot_id="00000000-0000-0000-0000-000000000000",
        pid=ident.pid,
        pgid=ident.pgid,
        start_ticks=ident.start_ticks,
        shim_pid=ident.pid,
        shim_start_ticks=ident.start_ticks,
    )
    started = time.monotonic()
    assert stop_jobs._stop_one(foreign, 0.2, None) == "already_exited"
    assert time.monotonic() - started < stop_jobs._SHIM_WAIT_S / 2
    assert proc.poll() is None and matches(ident)
