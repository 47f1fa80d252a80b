"""The scheduling loop of one api process: one timer, whatever the number of schedules.

It sleeps until the earliest ``next_due_ms`` of any schedule (one indexed query), or until a
schedule changes (``schedule_changed``, the facade's ScheduleHooks), or at most
``max_sleep_s`` as the fallback for a change made by another process. Every api process runs
one; the repository's cursor compare-and-set makes them decide each slot once between them
(docs/schedules.md §2). After a fire that created runs it kicks the dispatcher's drain, and
after one that recorded a cancel intent on a started run (overlap ``replace``) it wakes the
worker's cancellation sweep. Each decided slot's lateness goes to ``GET /metrics``
(``qinglong_schedule_fire_lateness_seconds``, docs/metrics.md).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from app.context.metrics import FIRE_LATENESS, SLOT_CAUGHT_UP, SLOT_ON_TIME
from app.domain.ids import now_ms
from app.failure_log import FailureLog
from app.storage.schedules_repo import ScheduleRepository

log = logging.getLogger("qinglong.schedules")

MAX_SLEEP_S = 30.0
# After a failed pass (database down), wait before trying again rather than spinning.
RETRY_S = 1.0
# A due schedule another loop holds locked (it commits in milliseconds): look again soon,
# without spinning. (One this build refuses is not due again until its retry.)
NOTHING_DECIDED_S = 0.02


class ScheduleLoop:
    """One daemon thread deciding due slots; ``schedule_changed`` wakes it."""

    def __init__(
        self,
        repo: ScheduleRepository,
        *,
        on_fired: Callable[[], None],
        on_cancel_requested: Callable[[], None] = lambda: None,
        max_sleep_s: float = MAX_SLEEP_S,
    ) -> None:
        self._repo = repo
        self._on_fired = on_fired
        self._on_cancel_requested = on_cancel_requested
        self._max_sleep_s = max_sleep_s
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def schedule_changed(self) -> None:
        """Re-read the earliest due slot now; never blocks, never raises."""
        self._wake.set()

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="ql-schedules", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop after the current pass (its transaction commits or rolls back whole)."""
        self._stopping.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)

    def _loop(self) -> None:
        failures = FailureLog(log, "schedule pass")
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                sleep_s = self.pass_once()
                failures.succeeded()
            except Exception as exc:  # the next pass retries; the slot stays due
                failures.failed(exc)  # a line when it starts, then one a minute
                sleep_s = RETRY_S
            if sleep_s > 0:
                self._wake.wait(sleep_s)

    def pass_once(self) -> float:
        """Decide what is due now; the seconds to sleep before the next pass."""
        result = self._repo.fire_due()
        for late in result.lateness:
            slot = SLOT_ON_TIME if late.on_time else SLOT_CAUGHT_UP
            FIRE_LATENESS.labels(slot=slot).observe(late.seconds)
        if result.cancels_requested:
            self._on_cancel_requested()
        if result.runs_created:
            self._on_fired()
        if result.page_full:
            return 0.0
        earliest = self._repo.earliest_due_ms()
        if earliest is None:
            return self._max_sleep_s
        # A few ms late rather than early: a pass that wakes before the slot finds nothing.
        wait_s = (earliest - now_ms()) / 1000 + 0.002
        floor = NOTHING_DECIDED_S if result.schedules_decided == 0 else 0.0
        return min(max(wait_s, floor), self._max_sleep_s)
