"""The worker's one recovery path: everything that settles what the worker was not there for.

A reconciler (stale attempts, the journal's ``spawned`` entries) and the cancellation sweep,
driven by one ``RecoveryLoop`` thread; the start-up backlog drain, settled back to back
before the worker serves (docs/journal-settle.md); and the live completion path, which
leaves an attempt alone while recovery is stopping it and asks recovery for a decision when
a shim exited without a usable receipt. The worker's composition root
(app/context/worker_process.py) builds the adapters and hands them in as ports.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from app.domain.profiles import Profile
from app.execution.cancellation import CancellationSweep
from app.execution.completion import CompletionService, ConsumeResult
from app.execution.journal_settle import SettleReport, WatchCallback
from app.execution.ports import (
    ActiveAttemptSource,
    CancelIntents,
    JournalIndex,
    ProcessController,
    ProcessProbe,
    QuarantineFiles,
    ReceiptReservations,
    RunTransitions,
)
from app.execution.reconciler import Reconciler
from app.execution.recovery_loop import RecoveryLoop

log = logging.getLogger(__name__)


class WorkerRecovery:
    """Reconciler + cancellation sweep on one thread, the start-up drain, live consumption."""

    def __init__(
        self,
        *,
        attempts: ActiveAttemptSource,
        journal: JournalIndex,
        completion: CompletionService,
        transitions: RunTransitions,
        intents: CancelIntents,
        probe: ProcessProbe,
        controller: ProcessController,
        quarantine_files: QuarantineFiles,
        reservations: ReceiptReservations,
        profile: Profile,
        watch: WatchCallback,
        may_run: Callable[[], bool] = lambda: True,
    ) -> None:
        self._completion = completion
        self._reconciler = Reconciler(
            attempts=attempts, journal=journal, completion=completion, transitions=transitions,
            probe=probe, controller=controller, quarantine_files=quarantine_files,
            reservations=reservations, profile=profile, watch=watch,
        )  # fmt: skip
        sweep = CancellationSweep(
            attempts=attempts, intents=intents, controller=controller, profile=profile
        )
        self.loop = RecoveryLoop(
            reconciler=self._reconciler, cancellation=sweep,
            interval_s=profile.reconcile_interval_s, may_run=may_run,
        )  # fmt: skip

    def settle_backlog(self, *, threads: int = 0) -> SettleReport:
        """Settle the whole ``spawned`` backlog before serving (0 threads: inline)."""
        return self._reconciler.drain_journal(threads=threads)

    def start(self) -> None:
        """Start the loop; its first iteration is the start-up reconcile pass."""
        self.loop.start()

    def wake(self, *, reconcile: bool = False) -> None:
        """Run the cancellation sweep now (and a full reconcile pass too when ``reconcile``)."""
        self.loop.wake(reconcile=reconcile)

    def stop(self) -> None:
        """Stop the loop after its current pass; jobs are never touched by stopping."""
        self.loop.stop()

    def consume(self, *, run_id: str, attempt_id: str) -> ConsumeResult:
        """The live completion of an attempt whose shim exited (the watcher's callback)."""
        if self._reconciler.claimed(attempt_id):
            # Recovery is stopping this attempt to record ``lost``; it consumes afterwards.
            return ConsumeResult("absent")
        result = self._completion.consume(run_id=run_id, attempt_id=attempt_id)
        # An ending recorded is the usual case (/metrics counts ended runs): one info line per
        # run was noise in the worker's log and a share of its CPU in a burst (figures:
        # bench/README.md, "Figures behind choices").
        usual = result.status in ("applied", "already_terminal")
        log.log(logging.DEBUG if usual else logging.INFO, "attempt completion: %s", result.status)
        if result.status in ("absent", "quarantined"):
            # The shim exited without a usable receipt: let the reconciler decide now
            # (grace, then lost) instead of at the next cadence.
            self.wake(reconcile=True)
        return result
