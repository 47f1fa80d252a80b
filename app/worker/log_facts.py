"""What the completion transaction records about an attempt's log: size and truncation.

The size is the log file's length; truncation comes from the shim's one-time, content-free
fact file beside the log (``{"droppedBytes", "quotaBytes", "schemaVersion"}``). Both are
evidence only and never decide the ending (ADR-0007 §2.3).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from app.domain.artifacts import log_relpath, truncation_fact_relpath
from app.domain.model import LogInfo

_FACT_MAX_BYTES = 1024


def _open_regular(path: Path) -> tuple[int, int] | None:
    """(fd, size) of ``path`` if it is a regular file (no symlink followed, never blocking);
    None otherwise. The caller closes the fd."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
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
        size = st.st_size
        dropped = self._dropped(attempt_id)
        return LogInfo(bytes=size, truncated=dropped is not None, dropped_bytes=dropped or 0)

    def _dropped(self, attempt_id: str) -> int | None:
        opened = _open_regular(self.root / truncation_fact_relpath(attempt_id))
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
        value = fact.get("droppedBytes") if isinstance(fact, dict) else None
        if type(value) is int and value >= 0:
            return value
        return 0  # a fact exists but is unreadable: truncated, amount unknown
