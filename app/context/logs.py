"""Read-only access to an attempt's log artifact at its derived path (docs/design.md §3.6)."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, replace
from pathlib import Path

from app.domain.artifacts import log_head_bytes, log_relpath, shard_of, truncation_fact_relpath
from app.domain.model import Attempt, LogInfo
from app.domain.states import AttemptStatus
from app.worker.log_facts import Fact, read_fact

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class LogFile:
    """An open, read-only log (or an empty stand-in before the file exists); close it."""

    def __init__(
        self, *, attempt: Attempt, fd: int | None, size: int, truncated: bool, missing: bool = False
    ) -> None:
        self.attempt = attempt
        self.missing = missing  # no file at the derived path (not yet created, or removed)
        self.size = size  # a snapshot: reads never go past it, so a growing log stays consistent
        self.truncated = truncated
        self._fd = fd

    def read(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (never beyond the size snapshot)."""
        end = min(offset + length, self.size)
        if self._fd is None or offset >= end:
            return b""
        return os.pread(self._fd, end - offset, offset)

    def close(self) -> None:
        """Release the descriptor (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> LogFile:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class LogStore:
    """Opens logs under ``root`` component by component, never following a symlink."""

    root: Path
    quota_bytes: int

    def open(self, attempt: Attempt) -> LogFile:
        """Open the attempt's log read-only; a missing file is an empty log."""
        fds: list[int] = []
        try:
            try:
                fds.append(os.open(self.root, _DIR_FLAGS))
                fds.append(os.open(shard_of(attempt.id), _DIR_FLAGS, dir_fd=fds[-1]))
                fd = os.open(f"{attempt.id}.log", _FILE_FLAGS, dir_fd=fds[-1])
            except FileNotFoundError:
                # Not a second stat by path: the attempt must report the size this LogFile has.
                attempt = self._attach(attempt, 0, False)
                return LogFile(attempt=attempt, fd=None, size=0, truncated=False, missing=True)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                raise OSError("the log artifact is not a regular file")
            fact = read_fact(f"{attempt.id}.log.truncated", dir_fd=fds[-1])
        finally:
            for dfd in fds:
                os.close(dfd)
        if attempt.log is not None:  # recorded when the job ended: the head says no more
            truncated = fact is not None or attempt.log.truncated
        else:
            truncated = fact is not None or self._head_full(st.st_size)
        return LogFile(
            attempt=self._attach(attempt, st.st_size, truncated, fact),
            fd=fd,
            size=st.st_size,
            truncated=truncated,
        )

    def with_log_info(self, attempt: Attempt) -> Attempt:
        """The attempt with ``log`` filled in: the recorded facts, or the file's size meanwhile."""
        if attempt.log is not None:
            return attempt
        if attempt.status == AttemptStatus.CLAIMED:  # no artifact exists before dispatch
            return self._attach(attempt, 0, False)
        path = self.root / log_relpath(attempt.id)
        try:
            st = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            return self._attach(attempt, 0, False)
        if not stat.S_ISREG(st.st_mode):
            return self._attach(attempt, 0, False)
        fact = read_fact(self.root / truncation_fact_relpath(attempt.id))
        truncated = fact is not None or self._head_full(st.st_size)
        return self._attach(attempt, st.st_size, truncated, fact)

    def _head_full(self, size: int) -> bool:
        """While the job runs: output past the log's head goes to the shim's tail, and what
        does not fit there is dropped (docs/disk-full-and-readiness.md)."""
        return size >= log_head_bytes(self.quota_bytes)

    @staticmethod
    def _attach(attempt: Attempt, size: int, truncated: bool, fact: Fact | None = None) -> Attempt:
        """The attempt with its recorded log info, or what the files say meanwhile.

        Before the job ended nobody knows how much was dropped (the shim publishes the
        count with the fact when the job ends): ``dropped_bytes`` is then 0.
        """
        if attempt.log is not None:
            return attempt
        dropped, reason, gap_at = fact if fact is not None else (0, None, None)
        info = LogInfo(
            bytes=size, truncated=truncated, dropped_bytes=dropped, reason=reason, dropped_at=gap_at
        )
        return replace(attempt, log=info)
