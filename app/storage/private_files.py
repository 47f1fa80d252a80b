"""The service's own files are private to its OS user, and a start refuses when they are not.

What a job, another local user or a backup reader must never open: the data dir (0700), the
SQLite database with its ``-wal``, ``-shm`` and ``-journal`` files, and the secret key file
(0600). ``qinglong serve``, ``api``, ``worker`` and ``migrate`` call ``require_private``
before they open anything; like ssh with a loose key, they refuse with the one ``chmod``
that fixes it rather than repair a mode an operator may have set on purpose. ``serve`` and
``worker`` also refuse a worker socket directory another user may write to
(``require_own_socket_dir``).

New files are private by construction: the CLI runs every role under umask 077
(``SERVICE_UMASK``), so SQLite creates the database 0600, and it gives ``-wal`` and ``-shm``
the database file's own mode. PostgreSQL keeps no file here.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from app.storage.engine import sqlite_path

SERVICE_UMASK = 0o077
_SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


class NotPrivate(ValueError):
    """A path of the service is accessible by group or others; the message names the fix."""


def require_private(*, data_dir: Path, database_url: str, key_file: Path) -> None:
    """Raise ``NotPrivate`` naming every loose path and its ``chmod``; missing paths are fine."""
    paths = [data_dir, key_file]
    database = sqlite_path(database_url)
    if database is not None:
        paths += [database] + [database.with_name(database.name + s) for s in _SQLITE_SIDE_FILES]
    loose: list[tuple[Path, int]] = []
    for path in paths:
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            continue
        if mode & 0o077:
            loose.append((path, mode))
    if loose:
        raise not_private(loose)


def not_private(loose: list[tuple[Path, int]]) -> NotPrivate:
    """The one refusal for paths (with their ``st_mode``) that group or others can access."""
    what = ", ".join(f"{p} (mode {stat.S_IMODE(m):04o})" for p, m in loose)
    fix = "; ".join(f"chmod {700 if stat.S_ISDIR(m) else 600} {p}" for p, m in loose)
    return NotPrivate(f"{what} accessible by group or others; fix with: {fix}")


def require_own_socket_dir(socket_path: Path) -> None:
    """Raise ``NotPrivate`` when another user could take the worker socket at
    ``socket_path``: its directory is owned by a user other than root and this process's,
    writable by others (sticky or not), or writable by a group other than this process's. A
    missing directory is fine here.

    In such a directory a job (as the job user) can remove the socket and bind its own, or,
    sticky (/tmp), bind the path first while the worker is down, which a worker not running
    as root cannot undo: it could never start again (docs/job-user.md § The worker
    socket). The default, inside the data dir, is never such.
    """
    parent = socket_path.parent
    try:
        st = os.stat(parent)
    except FileNotFoundError:
        return
    mode, uid = st.st_mode, os.geteuid()
    keep = "or leave QL_WORKER_SOCKET unset (the socket then lives in the data dir)"
    if st.st_uid not in (0, uid):
        raise NotPrivate(
            f"{parent}, the worker socket's directory, is owned by uid {st.st_uid}, who may "
            f"replace the socket; fix with: chown {uid} {parent}, {keep}"
        )
    others = mode & 0o002
    strange_group = mode & 0o020 and st.st_gid != os.getegid()
    if others or strange_group:
        who = "others" if others else f"group {st.st_gid}, not this service's"
        fix = f"chmod {'o' if others else 'g'}-w {parent}"
        if st.st_uid != uid:  # root's: without the write bit the service could not bind
            fix = f"chown {uid} {parent} and chmod 0700 {parent}"
        raise NotPrivate(
            f"{parent} (mode {stat.S_IMODE(mode):04o}), the worker socket's directory, is "
            f"writable by {who}, so a job may take the socket's path; fix with: {fix}, {keep}"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise NotPrivate(
            f"{parent} (mode {stat.S_IMODE(mode):04o}, uid {st.st_uid}), the worker socket's "
            f"directory, is not writable by this service's user (uid {uid}), so the worker "
            f"could not create its socket; fix with: chown {uid} {parent}, {keep}"
        )
