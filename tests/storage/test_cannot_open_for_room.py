"""SQLite's SQLITE_CANTOPEN is told a full disk only when the directory's counts say so
(app/storage/unavailable.py): btrfs and vfat report no inode count at all (``f_files`` 0),
which is not "no inode left"; there a wrong path keeps the URL's advice."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from app.storage.unavailable import cannot_open_for_room


def _cantopen(tmp_path: Path) -> sqlite3.Error:
    (tmp_path / "a-directory.db").mkdir()
    try:
        sqlite3.connect(tmp_path / "a-directory.db").execute("select 1")
    except sqlite3.Error as exc:
        return exc
    raise AssertionError("SQLite opened a directory")


def _statvfs(*, files: int, favail: int, bavail: int, flag: int = 0) -> os.statvfs_result:
    return os.statvfs_result((4096, 4096, 1000, 500, bavail, files, favail, favail, flag, 255))


@pytest.mark.parametrize(
    ("files", "favail", "bavail", "flag", "full"),
    [
        (0, 0, 500, 0, False),  # btrfs, vfat: no inode count, blocks free
        (1000, 0, 500, 0, True),  # an inode count that ran out
        (1000, 10, 0, 0, True),  # no block left
        (0, 0, 500, os.ST_RDONLY, True),  # read-only
        (1000, 10, 500, 0, False),  # room: the path is what is wrong
    ],
)
def test_cantopen_is_a_full_disk_only_when_the_counts_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    files: int, favail: int, bavail: int, flag: int, full: bool,
) -> None:  # fmt: skip
    exc = _cantopen(tmp_path)
    answer = _statvfs(files=files, favail=favail, bavail=bavail, flag=flag)
    monkeypatch.setattr(os, "statvfs", lambda path: answer)
    assert cannot_open_for_room(exc, tmp_path / "a-directory.db") is full
