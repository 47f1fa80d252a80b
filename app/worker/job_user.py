"""Who a job runs as, and whether this worker may switch to it (docs/job-user.md).

Only the job changes identity: the shim stays the service's user and keeps the log and the
receipt. The worker resolves users here and hands the shim plain numbers in its spec.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.settings import JobUserSettings

# Capability numbers (linux/capability.h).
CAP_KILL = 5
CAP_SETGID = 6
CAP_SETUID = 7
_NEEDED = {"CAP_SETUID": CAP_SETUID, "CAP_SETGID": CAP_SETGID, "CAP_KILL": CAP_KILL}


@dataclass(frozen=True)
class JobUser:
    """A resolved OS user a job runs as: its primary group, no supplementary groups."""

    name: str
    uid: int
    gid: int


class JobUserUnavailable(ValueError):
    """A job user is configured but this process cannot run jobs as it (one line, exit 2)."""


def resolve(user: str) -> JobUser:
    """The user named ``user`` (a name or a numeric uid); JobUserUnavailable if unknown."""
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except (KeyError, OverflowError):
        raise JobUserUnavailable(f"job user {user!r} does not exist on this host") from None
    return JobUser(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _capabilities(field: str) -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def missing_capabilities() -> list[str]:
    """What the shims started by this process would lack to run and stop a job as another
    user: nothing for root; else CAP_SETUID, CAP_SETGID and CAP_KILL must be *ambient*,
    because each shim is a fresh ``execve`` of python, which keeps only ambient capabilities.
    """
    if os.geteuid() == 0:
        return []
    ambient = _capabilities("CapAmb")
    return [name for name, bit in _NEEDED.items() if not ambient & (1 << bit)]


@dataclass(frozen=True)
class JobPolicy:
    """The resolved job users of one worker, checked once at start-up."""

    default: JobUser | None
    allowed: dict[str, JobUser]
    umask: int
    home: Path | None
    home_root: Path

    @property
    def mode(self) -> str:
        """``job_user`` when jobs run as another user by default, else ``same_user``."""
        return "job_user" if self.default is not None else "same_user"

    def user_for(self, run_as: str | None) -> JobUser | None:
        """The user a job with this ``run_as`` runs as; KeyError when it is not allowed."""
        if run_as is None:
            return self.default
        return self.allowed[run_as]

    def spec(self, user: JobUser | None) -> dict[str, Any] | None:
        """The shim spec's ``job`` object (api-schemas/launch-protocol.md §2)."""
        if user is None:
            return None
        return {
            "uid": user.uid,
            "gid": user.gid,
            "umask": self.umask,
            "home": None if self.home is None else str(self.home),
            "home_root": str(self.home_root),
        }


def job_policy(settings: JobUserSettings) -> JobPolicy:
    """Resolve and check the configured job users; JobUserUnavailable names what is wrong.

    Refused: an unknown user, the service's own user (that would be a silent same-user run),
    root, a user whose primary group is root's or one of this process's, and a process that
    cannot switch (not root and the capabilities not ambient).
    """
    names = ([settings.user] if settings.user else []) + list(settings.allowed)
    users = {name: resolve(name) for name in names}
    for name, user in users.items():
        if user.uid == os.geteuid():
            raise JobUserUnavailable(
                f"job user {name!r} is the service's own user (uid {user.uid}); "
                "name a dedicated unprivileged user or unset QL_JOB_USER"
            )
        if user.uid == 0:
            raise JobUserUnavailable(f"job user {name!r} is root; name an unprivileged user")
        if user.gid in _service_groups():
            # The shim drops supplementary groups but keeps the primary one: the job would
            # hold the group of the service's group-readable files (the environment file of
            # deploy/, root:qinglong 0640, with the database password and the key).
            raise JobUserUnavailable(
                f"job user {name!r}: its primary group (gid {user.gid}) is the service's "
                "(or root's); give it a group of its own"
            )
    if users:
        missing = missing_capabilities()
        if missing:
            raise JobUserUnavailable(
                f"QL_JOB_USER/QL_JOB_USERS is set but this process (uid {os.geteuid()}) cannot "
                f"run jobs as another user: it lacks ambient {', '.join(missing)} "
                "(run as root or grant them, docs/job-user.md)"
            )
    if users and settings.home is None:
        for name, user in users.items():
            problem = home_root_problem(settings.home_root, user)
            if problem is not None:
                raise JobUserUnavailable(
                    f"QL_JOB_HOME_ROOT {settings.home_root} {problem} for job user {name!r}: "
                    "each job's fresh HOME is created there as that user (docs/job-user.md)"
                )
    default = users[settings.user] if settings.user else None
    allowed = {name: users[name] for name in settings.allowed}
    return JobPolicy(default, allowed, settings.umask, settings.home, settings.home_root)


def _service_groups() -> set[int]:
    """Groups a job's primary group must not be: root's and every group of this process."""
    return {0, os.getegid(), os.getgid(), *os.getgroups()}


def home_root_problem(root: Path, user: JobUser) -> str | None:
    """Why ``user`` could not create its per-job HOME in ``root``, or None.

    Checked at start-up so that a wrong root refuses the worker with one line instead of
    failing every job with HOME_FAILED. A root any user may write must be sticky (as /tmp
    is): without the bit one job user could rename or remove another's HOME.
    """
    try:
        st = os.lstat(root)
    except OSError:
        return "does not exist"
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    mode = st.st_mode
    if st.st_uid == user.uid:
        can = mode & stat.S_IWUSR and mode & stat.S_IXUSR
    elif st.st_gid == user.gid:  # the shim clears supplementary groups: the primary only
        can = mode & stat.S_IWGRP and mode & stat.S_IXGRP
    else:
        can = mode & stat.S_IWOTH and mode & stat.S_IXOTH
    if not can:
        return "is not writable"
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        return "is writable by anyone without the sticky bit"
    return None
