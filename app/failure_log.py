"""The log lines of a pass that keeps failing: when it starts, once a minute, when it recovers.

A background pass retries every second or so (the schedule loop, the dispatcher's drains);
with the database away, or not migrated, one line per try wrote 3,600 lines an hour into
the service's log, each the same. ``FailureLog`` writes the first failure of a kind, then
at most one line per ``every_s`` saying how many more failed the same way, and a line when a
pass succeeds again (after every failure line written, else at most one per ``every_s``: a
pass failing on and off must not write two lines a turn, nor end the log on a failure).
Only the exception's type is written (no message: it may hold data).

It is a module of its own, the lowest layer (docs/packages.md): the api's loops
(app/context), the worker's retention loop (app/worker) and its recovery loop
(app/execution) all use it, and it imports nothing of ``app``. The domain and the slot
arithmetic may not import it: writing a log line is I/O.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

REPEAT_EVERY_S = 60.0


class FailureLog:
    """Failures of one pass, logged without flooding (thread-safe): a failure of a kind is
    written at most once per ``every_s`` (the next line counts those not written), and the
    recovery at most once per ``every_s`` too, so a pass that fails on and off, or in turns
    of several kinds, writes a few lines a minute at most."""

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
        self._logged: dict[str, float] = {}  # kind: when its last line was written
        self._unlogged: dict[str, int] = {}  # kind: failures since that line
        self._failing = False
        self._total = 0  # failures since the last recovery line
        self._recovered_at = -math.inf
        self._said_failing = False  # a failure line written since the last recovery line

    def failed(self, exc: BaseException) -> None:
        """A pass failed with ``exc``: a line unless this kind had one within ``every_s``."""
        kind = type(exc).__name__
        with self._lock:
            now = self._clock()
            self._failing = True
            self._total += 1
            if now - self._logged.get(kind, -math.inf) < self._every_s:
                self._unlogged[kind] = self._unlogged.get(kind, 0) + 1
                return
            self._logged[kind] = now
            self._said_failing = True
            more = self._unlogged.pop(kind, 0)
            if more:
                self._log.log(
                    self._level, "%s failed: %s (%d more time(s) since the last line)",
                    self._what, kind, more,
                )  # fmt: skip
            else:
                self._log.log(self._level, "%s failed: %s", self._what, kind)

    def succeeded(self) -> None:
        """A pass succeeded: a line if it had been failing, at most one per ``every_s``
        unless a failure line was written since the last one (the log never ends on a
        failure the pass has recovered from)."""
        with self._lock:
            if not self._failing:
                return
            self._failing = False
            now = self._clock()
            if not self._said_failing and now - self._recovered_at < self._every_s:
                return  # on and off, unsaid: the next recovery line counts these too
            self._recovered_at, self._said_failing = now, False
            self._log.info("%s works again after %d failure(s)", self._what, self._total)
            self._total = 0
