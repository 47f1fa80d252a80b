"""Directory changes that must survive a power cut: the fsync, and the no-replace move.

Used by the receipt store (app/worker/receipts.py), the receipts audit (app/cli/receipts.py),
the secret key ring (app/storage/secret_crypto.py) and the instance id
(app/worker/instance.py). The shim keeps its own copies: it
imports nothing from ``app``. ``CannotMake`` is a start's one line for a file or directory
it could not make (docs/disk-full-and-readiness.md).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import time
from pathlib import Path

NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})  # what freeing space cures
# A file not made for want of room or on a read-only mount (the worker's socket).
CANNOT_MAKE = NO_ROOM | {errno.EROFS}
# What a start cannot get past by itself: those, or no write permission (receipts/).
CANNOT_WRITE = CANNOT_MAKE | {errno.EACCES}


class CannotMake(Exception):
    """A file, directory or socket a service start needs could not be made (a full disk, a
    read-only mount, a symlink loop): its ``str`` is the start's one line, naming the path
    and the system's words; on a full disk it says to free space in ``where`` (exit 1)."""

    def __init__(
        self, path: Path, error: OSError, *, where: str = "the data dir", what: str = ""
    ) -> None:
        self.path = path
        self.error = error
        why = os.strerror(error.errno) if error.errno else type(error).__name__
        line = f"cannot make {what or path} ({why})"
        if error.errno in NO_ROOM:
            line += f": free space in {where} and start again"
        super().__init__(line)


def read_only_error(path: Path) -> OSError | None:
    """EROFS when ``path`` is on a file system mounted read-only (root may write any mode,
    but not there); None otherwise, or when it cannot be told (``path`` missing)."""
    try:
        flags = os.statvfs(path).f_flag
    except OSError:
        return None
    if flags & os.ST_RDONLY:
        return OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
    return None


def fsync_dir(path: Path) -> None:
    """Make the entries of ``path`` durable (a file created, linked or removed in it)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def move_by_link(src: Path, dst: Path, src_stat: os.stat_result) -> bool:
    """Move ``src`` to ``dst`` by hard link, then unlink; never replace another file.

    ``src_stat`` is the caller's ``lstat`` of ``src``. A link an interrupted move left at
    ``dst`` (the same inode) counts as done, so a move replays safely; a different file at
    ``dst`` leaves everything as it is (False). Both directories are fsynced: the link
    before the unlink, so a power cut never loses the file.
    """
    try:
        os.link(src, dst, follow_symlinks=False)
    except FileExistsError:
        if not os.path.samestat(src_stat, os.lstat(dst)):
            return False
    fsync_dir(dst.parent)
    os.unlink(src)
    fsync_dir(src.parent)
    return True


# A temp file younger than this may be a publish still under way (a concurrent first start
# of the api and the worker): it is left for a later start.
TEMP_SWEEP_AGE_S = 60.0


def sweep_temps(path: Path, hex_chars: int) -> int:
    """Remove what a publish of ``path`` killed before its ``unlink`` left: regular files
    of this process's user in ``path``'s directory named exactly ``.<name>.<hex>.tmp``
    (``hex_chars`` lowercase hex digits), older than ``TEMP_SWEEP_AGE_S``. Such a file is
    a whole copy of what was being published (a key, an id), or a second name of it.
    Best effort: one that cannot be removed stays. How many were removed."""
    pattern = re.compile(rf"\.{re.escape(path.name)}\.[0-9a-f]{{{hex_chars}}}\.tmp")
    cutoff = time.time() - TEMP_SWEEP_AGE_S
    removed = 0
    try:
        entries = os.scandir(path.parent)
    except OSError:  # no directory yet (nothing to sweep), or none to read
        return 0
    with entries:
        for entry in entries:
            if not pattern.fullmatch(entry.name):
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
    if removed:
        with contextlib.suppress(OSError):
            fsync_dir(path.parent)
    return removed
