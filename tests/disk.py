"""Real full disks for tests: a size-limited tmpfs mounted in the test, filled on purpose.

``mounted_tmpfs`` skips the test with a visible reason where mounting is not permitted
(no root, no CAP_SYS_ADMIN), and always unmounts in ``finally``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

MIB = 1024 * 1024


@contextlib.contextmanager
def mounted_tmpfs(
    path: Path, *, size_mib: int = 60, uid: int | None = None, inodes: int | None = None
) -> Iterator[Path]:
    """Mount a ``size_mib`` tmpfs (mode 0700, owned by ``uid``, at most ``inodes`` files and
    directories) at ``path``; unmount after."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    opts = f"size={size_mib}m,mode=0700" + ("" if uid is None else f",uid={uid}")
    opts += "" if inodes is None else f",nr_inodes={inodes}"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"a real full disk needs `mount -t tmpfs`, not permitted here: {done.stderr}")
    try:
        yield path
    finally:
        _unmount(path)


def _unmount(path: Path) -> None:
    for _ in range(50):  # a process the test just ended may still hold a file for a moment
        if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
            return
        time.sleep(0.1)
    subprocess.run(["umount", str(path)], check=True)


def fill(directory: Path, *, leave_bytes: int = 0) -> Path:
    """Write a filler file until the file system is full (less ``leave_bytes``); its path."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        if leave_bytes:
            st = os.statvfs(directory)
            room = st.f_bavail * st.f_frsize - leave_bytes
            _write_until_full(fd, max(room, 0))
        else:
            _write_until_full(fd, None)
    finally:
        os.close(fd)
    return filler


def _write_until_full(fd: int, limit: int | None) -> None:
    chunk = MIB
    written = 0
    while chunk >= 512:
        size = chunk if limit is None else min(chunk, limit - written)
        if size <= 0:
            return
        try:
            written += os.write(fd, b"\0" * size)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            chunk //= 2


def use_every_inode(directory: Path) -> Path:
    """Make empty files under a new ``directory/inodes`` until the file system has no inode
    left (a tmpfs's ``inodes``): a directory, a socket or an empty file cannot be made then,
    as on a disk whose blocks are full (tmpfs gives those no block). The directory made."""
    filler = directory / "inodes"
    filler.mkdir()
    n = 0
    while True:
        try:
            (filler / str(n)).touch()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            return filler
        n += 1


def free_bytes(directory: Path) -> int:
    """Free space available to unprivileged writers."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize
