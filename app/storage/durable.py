"""Directory changes that must survive a power cut: the fsync, and the no-replace move.

Used by the receipt store (app/worker/receipts.py), the receipts audit (app/cli/receipts.py)
and the secret key ring (app/storage/secret_crypto.py). The shim keeps its own copies: it
imports nothing from ``app``.
"""

from __future__ import annotations

import os
from pathlib import Path


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
