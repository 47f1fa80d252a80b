"""What the completion transaction records about an attempt's log: size and truncation.

The size is the log file's length; truncation comes from the shim's one-time, content-free
fact file beside the log (``{"droppedBytes", "gapAt", "quotaBytes", "reason", "schemaVersion"}``;
``gapAt``, the log's offset where the dropped bytes were cut out, since the log keeps its tail).
Both are evidence only and never decide the ending (docs/design.md §3.6).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import NamedTuple

from app.domain.artifacts import log_relpath, truncation_fact_relpath
from app.domain.model import TRUNCATION_REASONS, LogInfo

_FACT_MAX_BYTES = 1024


class Fact(NamedTuple):
    """What a truncation fact says: how many bytes were dropped, why, and where."""

    dropped: int
    reason: str | None
    gap_at: int | None


def _open_regular(path: Path | str, dir_fd: int | None) -> tuple[int, int] | None:
    """(fd, size) of ``path`` if it is a regular file (no symlink followed, never blocking);
    None otherwise. The caller closes the fd."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError:
        return None
    regular = False
    try:
        st = os.fstat(fd)
        regular = stat.S_ISREG(st.st_mode)
    finally:
        if not regular:
            os.close(fd)
    return (fd, st.st_size) if regular else None


class LogFacts:
    """Reads log facts under the logs root."""

    def __init__(self, logs_root: Path) -> None:
        self.root = Path(logs_root)

    def log_info(self, attempt_id: str) -> LogInfo | None:
        """Size and truncation of the attempt's log; None when there is no log file."""
        try:  # the size only: a stat, not an open, an fstat and a close per receipt
            st = os.stat(self.root / log_relpath(attempt_id), follow_symlinks=False)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        fact = read_fact(self.root / truncation_fact_relpath(attempt_id))
        if fact is None:
            return LogInfo(bytes=st.st_size, truncated=False, dropped_bytes=0)
        return LogInfo(
            bytes=st.st_size,
            truncated=True,
            dropped_bytes=fact.dropped,
            reason=fact.reason,
            dropped_at=fact.gap_at,
        )


def read_fact(path: Path | str, *, dir_fd: int | None = None) -> Fact | None:
    """The truncation fact's dropped bytes, reason and gap; None when there is none.

    The shim publishes the fact complete or not at all; an unreadable one (an older shim's
    empty file) still means truncated, with the amount, the reason and the place unknown. A
    fact from before the log kept its tail has no ``gapAt``: its dropped bytes were the end.
    """
    opened = _open_regular(path, dir_fd)
    if opened is None:
        return None
    fd = opened[0]
    try:
        raw = os.read(fd, _FACT_MAX_BYTES + 1)
    finally:
        os.close(fd)
    try:
        fact = json.loads(raw) if len(raw) <= _FACT_MAX_BYTES else None
    except ValueError:
        fact = None
    if not isinstance(fact, dict):
        return Fact(0, None, None)
    value, reason, gap = fact.get("droppedBytes"), fact.get("reason"), fact.get("gapAt")
    dropped = value if type(value) is int and value >= 0 else 0
    return Fact(
        dropped,
        reason if reason in TRUNCATION_REASONS else None,
        gap if type(gap) is int and gap >= 0 else None,
    )
