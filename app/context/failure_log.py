"""The log lines of a pass that keeps failing: when it starts, once a minute, when it recovers.

A background pass retries every second or so (the schedule loop, the dispatcher's drains);
with the database away, or not migrated, one line per try wrote 3,600 lines an hour into
the service's log, each the same. ``FailureLog`` writes the first failure of a kind, then
at most one line per ``every_s`` saying how many more failed the same way, and one line when
a pass succeeds again. Only the exception's type is written (no message: it may hold data).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

REPEAT_EVERY_S = 60.0


class FailureLog:
    """Failures of one pass, logged without flooding (thread-safe)."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        level: int = logging.ERROR,
        every_s: float = REPEAT_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log, self._what, self._level = logger, what, level
        self._every_s, self._clock = every_s, clock
        self._lock = threading.Lock()
        self._kind: str | None = None  # the failing kind, None while passes succeed
        self._logged_at = 0.0
        self._unlogged = 0  # failures since the last line
        self._total = 0  # failures since the first of this run of them

    def failed(self, exc: BaseException) -> None:
        """A pass failed with ``exc``: a line when the failure is new or a minute passed."""
        kind = type(exc).__name__
        with self._lock:
            now = self._clock()
            self._total += 1
            if kind != self._kind:
                self._kind, self._logged_at, self._unlogged = kind, now, 0
                self._log.log(self._level, "%s failed: %s", self._what, kind)
            elif now - self._logged_at >= self._every_s:
                self._log.log(
                    self._level,
                    "%s failed: %s (%d more time(s) since the last line)",
                    self._what, kind, self._unlogged + 1,
                )  # fmt: skip
                self._logged_at, self._unlogged = now, 0
            else:
                self._unlogged += 1

    def succeeded(self) -> None:
        """A pass succeeded: one line if it had been failing."""
        with self._lock:
            if self._kind is None:
                return
            self._log.info("%s works again after %d failure(s)", self._what, self._total)
            self._kind, self._unlogged, self._total = None, 0, 0
