"""A job's own cgroup v2: where job cgroups live, and stopping what is left in one.

Where (``QL_CGROUP_ROOT``, read once by the worker): unset or ``auto`` → the worker's own
cgroup under the cgroup2 mount (``/proc/self/cgroup`` ``0::`` line, mapped through
``/proc/self/mountinfo``), which on a systemd host is the unit's delegated subtree
(``Delegate=yes``); an absolute path → that directory, which must lie on a cgroup2 mount;
``off`` → no cgroups. A root is used only if it is writable here (a probe child is created
and removed), so the process group stays the net wherever it is not (docs/leftovers.md).

The shim creates ``<root>/ql-<attempt id>`` and starts the job in it (launch-protocol.md §3);
the handle records that name. The stop path here addresses a job cgroup only by that name,
re-derived under the root and checked before use: a name made of the prefix and a UUIDv7, an
existing directory directly inside the root, not a symlink.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from app.domain.ids import is_uuid7

log = logging.getLogger(__name__)

PREFIX = "ql-"  # the shim's CGROUP_PREFIX
OFF = "off"
AUTO = "auto"
_POLL_SECONDS = 0.01


@dataclass(frozen=True)
class CgroupRoot:
    """A writable cgroup v2 directory under which each job gets its own child cgroup."""

    path: Path

    def job_dir(self, name: str | None) -> Path | None:
        """The job cgroup ``name`` checked before use, or None (no such name or directory)."""
        if name is None or not name.startswith(PREFIX) or not is_uuid7(name[len(PREFIX) :]):
            return None
        path = self.path / name
        try:
            st = os.lstat(path)
        except OSError:
            return None
        return path if stat.S_ISDIR(st.st_mode) else None


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as ``\\ooo``."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def cgroup2_mounts(mountinfo: str) -> list[tuple[str, Path]]:
    """(root within the hierarchy, mount point) of every cgroup2 mount in ``mountinfo``."""
    mounts = []
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, kind = head.split(), tail.split()
        if sep and len(fields) >= 5 and kind and kind[0] == "cgroup2":
            mounts.append((_unescape(fields[3]), Path(_unescape(fields[4]))))
    return mounts


def own_cgroup(proc_cgroup: str) -> str | None:
    """This process's cgroup v2 path (the ``0::`` line of ``/proc/self/cgroup``)."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def mounted_path(mounts: list[tuple[str, Path]], own: str | None) -> Path | None:
    """Where the cgroup ``own`` (a ``/proc/<pid>/cgroup`` path) is, through ``mounts``."""
    if own is None:
        return None
    for root, point in mounts:
        base = root.rstrip("/")
        if own == root or own.startswith(base + "/"):
            return point / own[len(base) :].lstrip("/")
    return None


def _usable(path: Path, mounts: list[tuple[str, Path]]) -> str | None:
    """Why ``path`` cannot hold job cgroups, or None when it can."""
    if path.is_symlink() or not path.is_dir():
        return "not a directory"
    if not any(path == point or point in path.parents for _root, point in mounts):
        return "not on a cgroup2 mount"
    procs = path / "cgroup.procs"
    if not os.access(path, os.W_OK) or not os.access(procs, os.W_OK):
        return "not writable"
    # The shim returns itself to the root after starting the job: a root with controllers
    # enabled for its children cannot hold processes (cgroup v2 "no internal processes").
    if path not in {point for _root, point in mounts}:
        with contextlib.suppress(OSError):
            if (path / "cgroup.subtree_control").read_text().strip():
                return "controllers enabled in cgroup.subtree_control"
    probe = path / f"{PREFIX}probe-{os.getpid()}"
    try:
        probe.mkdir(mode=0o755)
    except OSError as exc:
        return f"cannot create a child ({os.strerror(exc.errno or 0)})"
    with contextlib.suppress(OSError):
        probe.rmdir()
    return None


def detect(setting: str) -> CgroupRoot | None:
    """The cgroup root for job cgroups from the ``QL_CGROUP_ROOT`` setting and this host."""
    setting = setting.strip() or AUTO
    if setting == OFF:
        return None
    try:
        mounts = cgroup2_mounts(Path("/proc/self/mountinfo").read_text())
        own = own_cgroup(Path("/proc/self/cgroup").read_text())
    except OSError:
        mounts, own = [], None
    if setting == AUTO:
        candidate = mounted_path(mounts, own)
        if candidate is None:
            log.info("no cgroup v2 hierarchy: leftovers are stopped by process tree only")
            return None
    elif not setting.startswith("/"):
        log.warning("QL_CGROUP_ROOT must be an absolute path, %r or %r; cgroups off", AUTO, OFF)
        return None
    else:
        candidate = Path(setting)
    reason = _usable(candidate, mounts)
    if reason is not None:
        level = logging.INFO if setting == AUTO else logging.WARNING
        log.log(level, "cgroup root %s unusable (%s): process tree only", candidate, reason)
        return None
    return CgroupRoot(Path(os.path.realpath(candidate)))


def pids_problem(root: CgroupRoot | None) -> str | None:
    """Why the job cgroups under ``root`` have no ``pids.max``, or None when they have one.

    A child cgroup gets the pids controller's files only when its parent lists ``pids`` in
    ``cgroup.subtree_control``. Read, never changed: enabling a controller is the host's call
    (and a root that holds processes, as the worker's own cgroup does, cannot enable one)."""
    if root is None:
        return "no job cgroups"
    try:
        enabled = (root.path / "cgroup.subtree_control").read_text().split()
    except OSError as exc:
        return f"cannot read {root.path}/cgroup.subtree_control ({os.strerror(exc.errno or 0)})"
    if "pids" in enabled:
        return None
    try:
        available = (root.path / "cgroup.controllers").read_text().split()
    except OSError:
        available = []
    if "pids" in available:
        return f"pids not enabled in {root.path}/cgroup.subtree_control"
    return f"no pids controller in {root.path}/cgroup.controllers"


def _populated(path: Path) -> bool:
    """True while any process lives in ``path`` (FileNotFoundError once it was removed).

    A cgroup removed between the open and the read of its file answers ENODEV, not
    ENOENT: that is "removed" too (seen on Linux 6.18)."""
    try:
        text = (path / "cgroup.events").read_text()
    except OSError as exc:
        if exc.errno == errno.ENODEV:
            raise FileNotFoundError(errno.ENOENT, "cgroup removed", str(path)) from None
        raise
    for line in text.splitlines():
        if line.startswith("populated "):
            return line != "populated 0"
    return bool((path / "cgroup.procs").read_text().split())


def _wait_empty(path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _populated(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_SECONDS)
    return True


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _member(pid: int, name: str) -> bool:
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return False
    return any(line.startswith("0::") and line.endswith("/" + name) for line in lines)


def _kill_members(path: Path) -> None:
    """Without ``cgroup.kill`` (Linux < 5.14): SIGKILL each member through a pidfd, each
    re-checked to still be in this cgroup after the pidfd pinned it."""
    for pid in map(int, (path / "cgroup.procs").read_text().split()):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            if _member(pid, path.name):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(pidfd)


def settle(path: Path, *, patience: float, timeout: float) -> bool:
    """End the job cgroup ``path``: give the shim ``patience`` seconds to empty it, then kill
    whatever is left, wait up to ``timeout``, remove it. True when it is empty or gone."""
    try:
        if not _wait_empty(path, patience):
            kill(path)
            if not _wait_empty(path, timeout):
                return False
        with contextlib.suppress(OSError):
            path.rmdir()  # the shim may remove it first, or a late member keeps it busy
    except FileNotFoundError:
        pass  # removed by the shim meanwhile
    except OSError:
        return False
    return True


def kill(path: Path) -> None:
    """SIGKILL every process in the job cgroup ``path`` (one atomic write where possible)."""
    try:
        if (path / "cgroup.kill").exists():
            _write(path / "cgroup.kill", b"1")
        else:
            for _ in range(3):  # members may fork while we look
                _kill_members(path)
    except FileNotFoundError:
        pass
