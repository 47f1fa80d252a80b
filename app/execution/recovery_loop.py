"""The worker's recovery loop: one thread, one Event, no overlapping passes (docs/design.md §3.13).

A full reconcile pass runs at start and every ``profile.reconcile_interval_s``; the
cancellation sweep runs after it and on a faster tick, or at once when woken (the ``wake``
socket op after the api committed a cancel intent). Passes run on this thread only, so they
can never overlap; stop sets the Event and joins with a bound. A pass that keeps failing (the
database away or not migrated) is logged when it starts, once a minute, and when it works
again (``FailureLog``, one per kind of pass), not every half second.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from app.execution.cancellation import CancellationSweep
from app.execution.reconciler import Reconciler
from app.failure_log import FailureLog

log = logging.getLogger(__name__)

DEFAULT_SWEEP_INTERVAL_S = 0.5


class RecoveryLoop:
    """Runs reconcile passes and cancellation sweeps until stopped."""

    def __init__(
        self,
        *,
        reconciler: Reconciler,
        cancellation: CancellationSweep,
        interval_s: float,
        sweep_interval_s: float = DEFAULT_SWEEP_INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
        may_run: Callable[[], bool] = lambda: True,
    ) -> None:
        # The worker's lease is surely held (docs/several-hosts.md §4): a worker whose lease
        # may be superseded starts no pass and no sweep (fail closed) until it stops.
        self._may_run = may_run
        self._reconciler = reconciler
        self._cancellation = cancellation
        self._interval_s = interval_s
        self._sweep_interval_s = sweep_interval_s
        self._monotonic = monotonic
        self._event = threading.Event()
        self._stopping = threading.Event()
        self._full_requested = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ql-recovery", daemon=True)
        self.passes = 0  # completed full passes (observability for tests and logs)
        # One per kind: a sweep that works beside a reconcile that fails must not log both
        # every turn as a failure and a recovery.
        self._failures = {
            what: FailureLog(log, f"{what} pass", level=logging.WARNING)
            for what in ("reconcile", "cancellation")
        }

    def start(self) -> None:
        """Start the thread; its first iteration is the start-up reconcile pass."""
        self._thread.start()

    def wake(self, *, reconcile: bool = False) -> None:
        """Run the cancellation sweep now (and a full pass too when ``reconcile``)."""
        if reconcile:
            self._full_requested.set()
        self._event.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the current pass (bounded join); jobs are never touched by stopping."""
        self._stopping.set()
        self._event.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._cancellation.close(timeout)

    def _loop(self) -> None:
        next_full = self._monotonic()
        while not self._stopping.is_set():
            if not self._may_run():
                self._event.wait(self._sweep_interval_s)
                self._event.clear()
                continue
            if self._full_requested.is_set() or self._monotonic() >= next_full:
                self._full_requested.clear()
                self._guard("reconcile", self._full_pass)
                next_full = self._monotonic() + self._interval_s
            if self._stopping.is_set():
                return
            self._guard("cancellation", self._cancellation.run_once)
            wait = min(self._sweep_interval_s, max(next_full - self._monotonic(), 0.0))
            self._event.wait(wait)
            self._event.clear()

    def _full_pass(self) -> None:
        report = self._reconciler.run_pass()
        self.passes += 1
        # Not for routine work alone: completions (each has its events) and the purge of
        # consumed receipts' rows, which every ended job brings a retention window later.
        if (
            report.lost or report.failed or report.requeued or report.stopped
            or report.undecided or report.purged > report.purged_consumed
        ):  # fmt: skip
            log.info(
                "reconcile pass: examined %d completed %d lost %d failed %d requeued %d "
                "stopped %d undecided %d purged %d",
                report.examined,
                report.completed,
                report.lost,
                report.failed,
                report.requeued,
                report.stopped,
                report.undecided,
                report.purged,
            )

    def _guard(self, what: str, fn: Callable[[], object]) -> None:
        failures = self._failures[what]
        try:
            fn()
        except Exception as exc:  # a database hiccup ends this pass only; the next one retries
            failures.failed(exc)
        else:
            failures.succeeded()
