"""Settling the worker's ``spawned`` journal entries: one rule, at start-up and in each pass.

A ``spawned`` entry is a shim started with a journaled handle whose ending the journal has
not yet recorded as consumed. Both walks over such entries go through this module, so an
entry found at start-up and one found later are settled by the same rule:

* the worker's start-up drains the whole backlog back to back before its control socket
  opens (``drain``): a page at a time, on a few threads where the database takes concurrent
  writers, one query per page for which attempts are still active;
* every reconcile pass sweeps one bounded page (``sweep``), resuming where the last stopped.

An entry whose attempt has already ended (an ending in the database is final):

1. its job still runs (exact identity, docs/design.md §3.10) → stop it first; ``unknown`` keeps the
   entry ``spawned`` and consumes nothing (fail closed: the next sweep tries again);
2. its shim still lives → keep the entry and watch the shim: its receipt is still to come
   and is consumed as already_terminal when it exits (docs/design.md §3.12);
3. else the receipt, if any, goes to the completion service (already_terminal removes it,
   a bad one is quarantined); with none, the entry is marked consumed: nothing is left.

A handle exact identity cannot act on is never signalled: only step 3 applies.

An entry whose attempt is still active belongs to the reconciler's attempt pass (which
decides ``lost`` after its grace); the sweep skips it, and the start-up drain does only what
the watcher would: re-watch a live shim, or consume the receipt a shim left as it exited.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal, Protocol

from app.domain.journal import SPAWNED
from app.domain.model import ProcessHandle, plausible_handle
from app.execution.completion import ConsumeResult
from app.execution.ports import (
    ActiveAttemptSource,
    JournalEntryView,
    JournalIndex,
    ProcessController,
    ProcessProbe,
)
from app.failure_log import FailureLog

log = logging.getLogger(__name__)

DRAIN_PAGE = 64  # entries per page of the start-up drain (one active_among query each)

WatchCallback = Callable[[str, str, ProcessHandle], None]
# watched: a live shim is (re-)watched; recorded: its receipt recorded the ending;
# already_recorded: a receipt whose ending was recorded before (or by another host);
# quarantined: its receipt could not be read (the attempt pass decides); fenced: this
# worker's lease was superseded, nothing written; settled: no receipt and no process left,
# marked consumed; left: an active attempt whose shim is gone without a receipt, the attempt
# pass's to decide; undecided: the stop said unknown; failed: an error, retried by the next
# sweep.
Outcome = Literal[
    "watched", "recorded", "already_recorded", "quarantined", "fenced", "settled", "left",
    "undecided", "failed",
]  # fmt: skip
_CONSUMED: dict[str, Outcome] = {
    "applied": "recorded", "already_terminal": "already_recorded",
    "quarantined": "quarantined", "fenced": "fenced",
}  # fmt: skip


class Completion(Protocol):
    """The completion service's one entry point (``CompletionService.consume``)."""

    def consume(self, *, run_id: str, attempt_id: str) -> ConsumeResult:
        """Feed the attempt's receipt, if any, to the completion transaction."""
        ...


@dataclass(frozen=True, slots=True)
class _Settled:
    outcome: Outcome
    stopped: bool = False


@dataclass
class SettleReport:
    """Counts of one drain or sweep (no ids, no content)."""

    examined: int = 0
    stopped: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def undecided(self) -> int:
        """Entries kept because a stop could not be confirmed, or an error."""
        return self.outcomes.get("undecided", 0) + self.outcomes.get("failed", 0)

    def _add(self, results: Iterable[_Settled]) -> None:
        for result in results:
            self.examined += 1
            self.stopped += result.stopped
            self.outcomes[result.outcome] = self.outcomes.get(result.outcome, 0) + 1


class JournalSettle:
    """The one path that settles ``spawned`` journal entries (module docstring)."""

    def __init__(
        self,
        *,
        attempts: ActiveAttemptSource,
        journal: JournalIndex,
        completion: Completion,
        probe: ProcessProbe,
        controller: ProcessController,
        stop_grace_s: float,
        watch: WatchCallback | None = None,
    ) -> None:
        self._attempts = attempts
        self._journal = journal
        self._completion = completion
        self._probe = probe
        self._controller = controller
        self._stop_grace_s = stop_grace_s
        self._watch = watch
        self._sweep_cursor: tuple[int, str] | None = None
        # An entry that keeps failing (its stop raising, the database away) is met by every
        # sweep, twice a second: its line once, then once a minute, and a line when a whole
        # round (the drain, or the sweep's pages back to its start) failed on none again.
        self._failures = FailureLog(log, "journal settle of an entry", level=logging.WARNING)
        self._round_failed = False

    def drain(self, *, threads: int = 0) -> SettleReport:
        """Settle every ``spawned`` entry, page after page (start-up, before serving).

        ``threads`` 0 settles inline; more settles each page on that many threads, the
        page done before the next is read (a large backlog is never held in memory). The
        walk meets each entry once: a settled entry leaves ``spawned``, a kept one keeps its
        place behind the cursor; every transition is a compare-and-set, so a receipt is
        consumed once even when the reconciler or the watcher races for it.
        """
        report = SettleReport()
        pool = ThreadPoolExecutor(threads, thread_name_prefix="ql-resume") if threads else None
        try:
            after: tuple[int, str] | None = None
            while True:
                page = self._journal.page_by_state(state=SPAWNED, limit=DRAIN_PAGE, after=after)
                report._add(self._drain_page(page, pool))
                if len(page) < DRAIN_PAGE:
                    if not report.outcomes.get("failed"):
                        self._failures.succeeded()
                    return report
                after = _cursor_after(page)
        finally:
            if pool is not None:
                pool.shutdown()

    def _drain_page(
        self, page: Sequence[JournalEntryView], pool: ThreadPoolExecutor | None
    ) -> list[_Settled]:
        active = self._attempts.active_among([entry.attempt_id for entry in page])

        def one(entry: JournalEntryView) -> _Settled:
            return self._entry(entry, active=entry.attempt_id in active)

        # Settled to the last entry before the next page is read.
        return list(map(one, page) if pool is None else pool.map(one, page))

    def sweep(self, *, limit: int) -> SettleReport:
        """One bounded page of entries whose attempt ended, after the last sweep's cursor."""
        page = self._journal.page_by_state(state=SPAWNED, limit=limit, after=self._sweep_cursor)
        self._sweep_cursor = _cursor_after(page) if len(page) == limit else None
        # One query for the page. An attempt found ended stays ended (endings are final);
        # one that ends after this read is simply left to the next sweep.
        active = self._attempts.active_among([entry.attempt_id for entry in page])
        report = SettleReport()
        report._add(self._entry(e, active=False) for e in page if e.attempt_id not in active)
        self._round_failed = self._round_failed or bool(report.outcomes.get("failed"))
        if self._sweep_cursor is None:  # a round ended: the next page starts it again
            if not self._round_failed:
                self._failures.succeeded()
            self._round_failed = False
        return report

    def _entry(self, entry: JournalEntryView, *, active: bool) -> _Settled:
        try:
            return self._active(entry) if active else self._ended(entry)
        except Exception as exc:  # one entry never stops the walk; the next sweep retries
            self._failures.failed(exc)
            return _Settled("failed")

    def _active(self, entry: JournalEntryView) -> _Settled:
        handle = entry.handle
        if handle is not None and self._probe.shim_alive(handle):
            if self._watch is not None:
                self._watch(entry.run_id, entry.attempt_id, handle)  # idempotent re-arm
            return _Settled("watched")
        # The shim is gone: it published its receipt (or failed to) before exiting, so this
        # is what the watcher does on a shim exit; a missing receipt is the attempt pass's.
        result = self._completion.consume(run_id=entry.run_id, attempt_id=entry.attempt_id)
        return _Settled(_CONSUMED.get(result.status, "left"))

    def _ended(self, entry: JournalEntryView) -> _Settled:
        handle = entry.handle
        stopped = False
        if plausible_handle(handle):
            assert handle is not None
            alive = self._probe.job_alive(handle)
            if alive or handle.cgroup is not None:
                # Ended in the database yet running (a worker killed mid-launch after the
                # coordinator gave up; a shim SIGKILLed after its run ended): docs/design.md §3.10,
                # stop the exact identity before the entry may leave the journal's scan set.
                # A job cgroup is ended too, as in the attempt pass: its shim, killed, never
                # removed it (another host ended the run `lost` meanwhile, say), and whatever
                # is left in it goes with it.
                result = self._controller.stop(handle, grace_seconds=self._stop_grace_s)
                if result == "unknown":
                    return _Settled("undecided")  # fail closed: kept for the next sweep
                stopped = alive  # either way no job is left
            if self._probe.shim_alive(handle):
                if self._watch is not None:
                    self._watch(entry.run_id, entry.attempt_id, handle)
                return _Settled("watched", stopped)  # its receipt is still to come
        consumed = self._completion.consume(run_id=entry.run_id, attempt_id=entry.attempt_id)
        if consumed.status != "absent":
            return _Settled(_CONSUMED.get(consumed.status, "recorded"), stopped)
        # The attempt ended without this receipt and no process of it is left to publish one.
        self._journal.mark_consumed(attempt_id=entry.attempt_id)
        return _Settled("settled", stopped)


def _cursor_after(page: Sequence[JournalEntryView]) -> tuple[int, str]:
    return (page[-1].updated_at_ms, page[-1].attempt_id)
