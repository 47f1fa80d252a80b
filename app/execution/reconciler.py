"""The reconciler: bring every active attempt to the truth after crashes (docs/design.md §3.13).

docs/design.md §3.13 fixes the order for each active attempt, found through the database only
(keyset pages with a resume cursor across passes, never a listing of the receipt directory):

1. a receipt is present → the completion service (the one path to a terminal state);
2. ``running`` and the shim (or the job) alive → keep, the live watcher owns it;
3. shim exited: if the job's group still lives (the shim was SIGKILLed), stop the exact job
   identity first; then one short publish grace, a last look for a receipt, and ``lost`` with
   RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT — never a guessed success;
4. ``starting`` with no journal entry after a grace (the api died after T1, its request was
   lost, or the worker stalled before journaling it) → fence the attempt first (a journal
   entry that refuses any late launch of it), then requeue the run with a fresh attempt,
   the old one failed EXECUTOR_UNAVAILABLE: provably nothing of it was spawned, so the run
   is not failed for it; with a ``spawn_failed`` entry → ``failed``
   RECOVERY_START_NOT_SPAWNED after the grace; with only a ``reserved`` entry (the worker
   died around the spawn, before it could journal a handle), after a longer grace, recovery
   takes the shim's receipt reservation name first: if it gets it, no shim can start the
   job → the entry is journaled ``fenced`` and the run requeued as above; if a live shim
   holds it → keep (its receipt ends the attempt); a dead one (or one that never wrote its
   identity) → ``lost`` RECOVERY_IDENTITY_UNSUPPORTED, never a clean ending; ``starting``
   with a journaled spawn (the api died between T1 and T2, docs/design.md §3.8)
   → stop the exact identity, then ``lost`` RECOVERY_START_INTERRUPTED, only if the stop said
   ``stopped``/``already_exited`` (``unknown`` leaves it: fail closed);
5. a handle we cannot verify → ``lost`` RECOVERY_IDENTITY_UNSUPPORTED, nobody is signalled.

Each pass also sweeps journal entries still ``spawned`` whose attempt already ended, by the
rule the worker's start-up drain uses too (``journal_settle.py``: a job still running is
stopped by exact identity before its entry is consumed), and purges settled journal rows
and quarantined files after the profile's retention. Every part is bounded per pass. Passes
never overlap: only the recovery loop's one thread calls them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from app.domain.errors import ErrorCode, InvalidTransition, NotFound, VersionConflict
from app.domain.ids import now_ms
from app.domain.journal import CONSUMED, FENCED, QUARANTINED, RESERVED, SPAWN_FAILED
from app.domain.model import plausible_handle
from app.domain.profiles import Profile
from app.execution.completion import CompletionService, ConsumeResult
from app.execution.journal_settle import JournalSettle, SettleReport, WatchCallback
from app.execution.ports import (
    ActiveAttemptSource,
    ActiveAttemptView,
    JournalIndex,
    ProcessController,
    ProcessProbe,
    QuarantineFiles,
    ReceiptReservations,
    RunTransitions,
)
from app.failure_log import FailureLog

log = logging.getLogger(__name__)
# What RunTransitions raises when the attempt moved on before this pass wrote (its Raises:).
_MOVED_ON = (NotFound, InvalidTransition, VersionConflict)

# A launch journals ``reserved`` a socket round trip after T1; a starting attempt younger
# than this may still be on its way to the worker or to T2, so it is left alone.
DEFAULT_START_GRACE_S = 2.0
# ``reserved`` lasts only while the shim reports its status (launcher timeout 10 s).
RESERVED_EXTRA_GRACE_S = 10.0


@dataclass
class PassReport:
    """Counts of one pass (no ids, no content)."""

    examined: int = 0
    completed: int = 0
    kept: int = 0
    lost: int = 0
    failed: int = 0
    requeued: int = 0
    stopped: int = 0
    undecided: int = 0
    purged: int = 0
    # Of ``purged``, the consumed receipts' rows: every ended job's, a retention window later
    # (routine: the loop writes no line for them alone).
    purged_consumed: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)


class Reconciler:
    """One bounded pass at a time over active attempts, the journal and retention."""

    def __init__(
        self,
        *,
        attempts: ActiveAttemptSource,
        journal: JournalIndex,
        completion: CompletionService,
        transitions: RunTransitions,
        probe: ProcessProbe,
        controller: ProcessController,
        quarantine_files: QuarantineFiles,
        reservations: ReceiptReservations,
        profile: Profile,
        watch: WatchCallback | None = None,
        start_grace_s: float = DEFAULT_START_GRACE_S,
        clock: Callable[[], int] = now_ms,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._attempts = attempts
        self._journal = journal
        self._completion = completion
        self._transitions = transitions
        self._probe = probe
        self._controller = controller
        self._quarantine_files = quarantine_files
        self._reservations = reservations
        self._profile = profile
        self._watch = watch
        self._start_grace_ms = int(start_grace_s * 1000)
        self._clock = clock
        self._sleep = sleep
        self._claims: set[str] = set()  # attempts this pass is stopping to end them itself
        self._claims_lock = threading.Lock()
        self._cursor: str | None = None  # resume cursor over active attempts, across passes
        self._journal_settle = JournalSettle(
            attempts=attempts, journal=journal, completion=completion, probe=probe,
            controller=controller, stop_grace_s=profile.stop_grace_s, watch=watch,
        )  # fmt: skip
        # An attempt that fails every pass (its journal unreadable, say) is retried each pass:
        # a line when it starts, once a minute, and when a whole round of the active attempts
        # (one or more passes, from the first to the last) had none failing.
        self._attempt_failures = FailureLog(log, "reconcile of an attempt", level=logging.WARNING)
        self._failed_this_round = False  # since the cursor last wrapped around

    def claimed(self, attempt_id: str) -> bool:
        """True while a pass is stopping this attempt to record its own ending.

        The live completion path skips such an attempt: the receipt its shim writes after
        our TERM is not the job's own ending and must not win over ``lost`` (the pass
        consumes it afterwards, as already_terminal, and cleans it up).
        """
        with self._claims_lock:
            return attempt_id in self._claims

    def drain_journal(self, *, threads: int = 0) -> SettleReport:
        """Settle the whole ``spawned`` backlog back to back (start-up, before any pass)."""
        return self._journal_settle.drain(threads=threads)

    # -- the pass ---------------------------------------------------------------------------

    def run_pass(self) -> PassReport:
        """Reconcile at most pages x page size attempts, sweep the journal, purge retention."""
        report = PassReport()
        size = self._profile.reconcile_page_size
        for _ in range(self._profile.reconcile_pages):
            page = self._attempts.active_attempts(limit=size, after_id=self._cursor)
            for attempt in page:
                report.examined += 1
                try:
                    self._one(attempt, report)
                except Exception as exc:  # one attempt never stops the pass; retried next pass
                    report.undecided += 1
                    self._failed_this_round = True
                    self._attempt_failures.failed(exc)
            if len(page) < size:
                self._cursor = None  # wrapped around: the next pass starts from the beginning
                # Works again only once a whole round of the active attempts had no failure:
                # a pass that did not reach the failing attempt proves nothing of it.
                if not self._failed_this_round:
                    self._attempt_failures.succeeded()
                self._failed_this_round = False
                break
            self._cursor = page[-1].attempt_id
        self._sweep_journal(report)
        report.purged, report.purged_consumed = self._purge_retention()
        return report

    def _one(self, attempt: ActiveAttemptView, report: PassReport) -> None:
        if self._consumed(attempt, report):
            return
        if attempt.status == "starting":
            self._starting(attempt, report)
            return
        handle = attempt.handle
        if attempt.handle_invalid or not plausible_handle(handle):
            self._end(attempt, ErrorCode.RECOVERY_IDENTITY_UNSUPPORTED, lost=True, report=report)
            return
        assert handle is not None
        if self._probe.shim_alive(handle):
            report.kept += 1
            if self._watch is not None:
                self._watch(attempt.run_id, attempt.attempt_id, handle)  # idempotent re-arm
            return
        if self._probe.job_alive(handle) or handle.cgroup is not None:
            # The shim died (SIGKILL) but the job lives on, or its main process ended and the
            # rest of it may still run in its cgroup (the shim never got to kill it): nobody
            # can publish its receipt, so the whole job is stopped first (docs/leftovers.md).
            result = self._controller.stop(handle, grace_seconds=self._profile.stop_grace_s)
            if result == "unknown":
                report.undecided += 1  # fail closed: never mark lost while it may still run
                return
            if result == "stopped":  # not ``already_exited``: gone before (a restored backup)
                report.stopped += 1
        self._after_grace(attempt, ErrorCode.RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT, report)

    def _starting(self, attempt: ActiveAttemptView, report: PassReport) -> None:
        # Age since T1, not since the attempt was created: a run that waited in the queue
        # longer than the grace is still only milliseconds into its start (found under a
        # 1,000-run backlog, bench/trivial.py).
        since = self._attempts.starting_since_ms(attempt.run_id) or attempt.created_at_ms
        age_ms = self._clock() - since
        entry = self._journal.get(attempt.attempt_id)
        if entry is None:
            if age_ms < self._start_grace_ms:
                report.kept += 1
                return
            # Fence before anything else: from this commit on, the launcher refuses any late
            # request for this attempt, so nothing can spawn for it (docs/backlog-requeue.md).
            # If the launch reserved first, its entry stands and is judged below like any other.
            entry = self._journal.fence(attempt_id=attempt.attempt_id, run_id=attempt.run_id)
        if entry.state == FENCED:
            # Fenced by us (now, or by a pass that crashed before the requeue committed).
            self._requeue(attempt, report)
            return
        if entry.state == SPAWN_FAILED:
            if age_ms < self._start_grace_ms:
                report.kept += 1
                return
            self._end(attempt, ErrorCode.RECOVERY_START_NOT_SPAWNED, lost=False, report=report)
            return
        if entry.state == RESERVED:
            # Reserved, never journaled spawned: the worker died between its journal commit
            # and recording the handle (a live launch records it within the launcher's 10 s).
            if age_ms < self._start_grace_ms + int(RESERVED_EXTRA_GRACE_S * 1000):
                report.kept += 1
                return
            self._reserved(attempt, report)
            return
        if not plausible_handle(entry.handle):
            self._end(attempt, ErrorCode.RECOVERY_IDENTITY_UNSUPPORTED, lost=True, report=report)
            return
        if age_ms < self._start_grace_ms:
            report.kept += 1  # the api may be committing T2 right now
            return
        assert entry.handle is not None
        with self._claims_lock:
            self._claims.add(attempt.attempt_id)  # before any signal (see ``claimed``)
        try:
            result = self._controller.stop(entry.handle, grace_seconds=self._profile.stop_grace_s)
            if result == "stopped":
                # We ended it: whatever receipt the shim now writes is not the job's ending.
                report.stopped += 1
                self._end(attempt, ErrorCode.RECOVERY_START_INTERRUPTED, lost=True, report=report)
        finally:
            with self._claims_lock:
                self._claims.discard(attempt.attempt_id)
        if result == "unknown":
            report.undecided += 1
        elif result == "stopped":
            self._consumed(attempt, report)  # already_terminal: cleans a receipt left behind
        else:
            self._after_grace(attempt, ErrorCode.RECOVERY_START_INTERRUPTED, report)

    def _reserved(self, attempt: ActiveAttemptView, report: PassReport) -> None:
        # A shim claims the attempt with its receipt reservation (O_EXCL) before it starts
        # the job, and writes its identity there; recovery takes that same name first
        # (docs/reserved-launch.md). Whoever holds it settles what may have run.
        holder = self._reservations.claim_reservation(attempt.attempt_id)
        if holder == "fenced":
            # No shim can start the job any more. The name was free also if the shim had
            # already published (link, then unlink of the temp): then its receipt ends it.
            if self._consumed(attempt, report):
                return
            # Journal first: the requeue commits only after the entry says fenced. If the
            # entry moved on meanwhile (the launch recorded its outcome), the next pass
            # judges what it says.
            if self._journal.mark_fenced(attempt_id=attempt.attempt_id):
                self._requeue(attempt, report)
            return
        if holder == "shim_alive":
            # Its job runs (or is about to): the shim publishes a receipt when it ends, and
            # the first step of a later pass consumes it from ``starting``.
            report.kept += 1
            return
        if holder == "unreadable":
            report.undecided += 1  # a receipt being published over the claim: next pass
            return
        # The shim is gone without a receipt (it may have left a job nobody can identify),
        # or never wrote its identity and may still start one: fail closed, lost (after the
        # publish grace: a dying shim's receipt may be just landing).
        self._after_grace(attempt, ErrorCode.RECOVERY_IDENTITY_UNSUPPORTED, report)

    def _after_grace(self, attempt: ActiveAttemptView, code: ErrorCode, report: PassReport) -> None:
        # docs/design.md §3.13 step 3: the process exited; a receipt may still come (one grace).
        self._sleep(self._profile.receipt_publish_grace_s)
        if self._consumed(attempt, report):
            return
        self._end(attempt, code, lost=True, report=report)

    def _consumed(self, attempt: ActiveAttemptView, report: PassReport) -> bool:
        result: ConsumeResult = self._completion.consume(
            run_id=attempt.run_id, attempt_id=attempt.attempt_id
        )
        report.outcomes[result.status] = report.outcomes.get(result.status, 0) + 1
        if result.status in ("applied", "already_terminal"):
            report.completed += 1
            return True
        if result.status == "fenced":
            # Our lease epoch is superseded: this worker decides nothing more (fail closed).
            report.undecided += 1
            return True
        return False  # absent, or quarantined (the run is untouched: decide from identity)

    def _requeue(self, attempt: ActiveAttemptView, report: PassReport) -> None:
        try:
            self._transitions.requeue_unspawned(
                run_id=attempt.run_id, attempt_id=attempt.attempt_id
            )
        except _MOVED_ON:
            return  # it moved on meanwhile: that stands (the fence still refuses the launch)
        # The fence entry stays: it refuses the late launch until retention purges it, and
        # the launcher refuses any attempt no longer ``starting`` after that.
        report.requeued += 1

    def _end(
        self, attempt: ActiveAttemptView, code: ErrorCode, *, lost: bool, report: PassReport
    ) -> None:
        try:
            self._transitions.fail_attempt(
                run_id=attempt.run_id, attempt_id=attempt.attempt_id, error_code=code, lost=lost
            )
        except _MOVED_ON:
            return  # it ended (or moved on) meanwhile: that ending stands
        if lost:
            report.lost += 1
        else:
            report.failed += 1
        # Nothing is left to consume: the entry leaves the journal's scan set.
        self._journal.mark_consumed(attempt_id=attempt.attempt_id)

    # -- journal sweep: ended attempts whose process may still live -------------------------

    def _sweep_journal(self, report: PassReport) -> None:
        swept = self._journal_settle.sweep(limit=self._profile.reconcile_page_size)
        report.stopped += swept.stopped
        report.undecided += swept.undecided

    # -- retention (docs/design.md §4: rows and quarantined files by profile) -------------------

    def purge_retention(self) -> int:
        """Delete settled journal rows and quarantined files past retention; bounded.
        Returns how many rows went."""
        return self._purge_retention()[0]

    def _purge_retention(self) -> tuple[int, int]:
        """``purge_retention``: (rows deleted, of which consumed receipts' rows)."""
        budget = self._profile.reconcile_pages * self._profile.reconcile_page_size
        now = self._clock()
        purged = consumed = 0
        consumed_before = now - int(self._profile.consumed_receipt_retention_s * 1000)
        quarantined_before = now - int(self._profile.quarantine_retention_s * 1000)
        for state, before in (
            (CONSUMED, consumed_before),
            (SPAWN_FAILED, consumed_before),
            (FENCED, consumed_before),
            (QUARANTINED, quarantined_before),
        ):
            page = self._journal.page_by_state(state=state, limit=budget)
            due = [entry for entry in page if entry.updated_at_ms <= before]  # oldest first
            # A consumed entry's attempt has ended; the others may still be needed.
            needed = [] if state == CONSUMED else [entry.attempt_id for entry in due]
            active = self._attempts.active_among(needed)
            # Those the attempt pass still needs keep their evidence.
            settled = [entry.attempt_id for entry in due if entry.attempt_id not in active]
            # Files first, durably: a crash in between leaves rows whose files are gone
            # (fine), never a file nobody indexes any more (nothing lists the directories).
            for attempt_id in settled:
                if state == QUARANTINED:
                    self._quarantine_files.remove_quarantined(attempt_id)  # fsyncs itself
                else:
                    # Normally gone already; a crash after the completion commit (or a shim
                    # killed mid-publication: its temp files) left it.
                    self._quarantine_files.remove(attempt_id)
            if state != QUARANTINED and settled:
                # Neither that unlink nor the live path's was fsynced: once per shard now.
                self._quarantine_files.sync_removed(settled)
            for attempt_id in settled:
                if self._journal.delete_settled(attempt_id=attempt_id, state=state):
                    purged += 1
                    if state == CONSUMED:
                        consumed += 1
        return purged, consumed
