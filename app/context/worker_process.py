"""Composition root of the worker process (DESIGN.md, Processes).

settings → engine → repositories, receipt store, journal → completion service → watcher →
launcher → control server. Shutdown closes the socket, stops watching and disposes the
engine; it never signals a job: jobs are parented by their shims, in their own sessions,
and are picked up again at the next start (watcher re-arm and the recovery loop).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sqlalchemy import Engine, QueuePool

from app.domain.errors import DomainError, ErrorCode
from app.domain.model import ProcessHandle
from app.execution.cancellation import CancellationSweep
from app.execution.completion import CompletionService, ConsumeResult
from app.execution.reconciler import Reconciler
from app.execution.recovery_loop import RecoveryLoop
from app.settings import Settings
from app.storage.engine import make_engine
from app.storage.journal_repo import SPAWNED, JournalRepository
from app.storage.migrate import current_revision, head_revision
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.worker.cgroups import CgroupRoot, detect
from app.worker.launcher import IdentityController, ShimLauncher
from app.worker.log_facts import LogFacts
from app.worker.probe import HandleProbe
from app.worker.receipts import ReceiptStore
from app.worker.server import ControlServer
from app.worker.watcher import ShimWatcher, shim_alive

log = logging.getLogger(__name__)

_RESUME_PAGE = 64
# Start-up settling on PostgreSQL: each receipt costs several serial round trips and a
# commit, so a few threads (each on its own pooled connection) overlap them. SQLite has one
# writer at a time: there the backlog is settled inline, on the starting thread.
_SETTLE_THREADS = 4


class NotMigrated(DomainError):
    """The database is not at the newest migration: the worker never migrates."""

    def __init__(self) -> None:
        super().__init__(
            ErrorCode.VALIDATION_FAILED,
            "the database is not migrated to the newest schema; run `qinglong migrate` first",
        )


@dataclass
class WorkerParts:
    """Everything the worker process built (exposed for tests and the CLI)."""

    engine: Engine
    journal: JournalRepository
    runs: RunRepository
    reader: RunReader
    receipts: ReceiptStore
    completion: CompletionService
    watcher: ShimWatcher
    launcher: ShimLauncher
    server: ControlServer
    recovery: RecoveryLoop | None = None


class WorkerProcess:
    """The running worker: start, serve until told to stop, stop without touching jobs."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.parts: WorkerParts | None = None
        self._stop = threading.Event()
        self._reconciler: Reconciler | None = None
        self._cgroup_root: CgroupRoot | None = None

    def start(self) -> WorkerParts:
        """Check the schema, build every part, re-arm live completion, open the socket."""
        s = self.settings
        engine = make_engine(s.database_url)
        try:
            if current_revision(engine) != head_revision():
                raise NotMigrated()
            s.ensure_data_dir()
            receipts = ReceiptStore(s.receipts_dir)
            receipts.ensure_root()
            journal = JournalRepository(engine)
            runs = RunRepository(engine)
            completion = CompletionService(
                receipts=receipts, journal=journal, completions=runs, log_facts=LogFacts(s.logs_dir)
            )
            watcher = ShimWatcher(lambda run_id, attempt_id: self._consume(run_id, attempt_id))
            self._cgroup_root = detect(s.cgroup_root)
            launcher = ShimLauncher(
                journal=journal, receipts=receipts, on_spawned=watcher.add, mode=s.shim_mode,
                cgroup_root=self._cgroup_root,
            )  # fmt: skip
            server = ControlServer(
                path=s.socket_path,
                launcher=launcher,
                controller=IdentityController(cgroup_root=self._cgroup_root),
                on_wake=self._wake,
            )
            self.parts = WorkerParts(
                engine,
                journal,
                runs,
                RunReader(engine),
                receipts,
                completion,
                watcher,
                launcher,
                server,
            )
            watcher.start()
            self._resume()
            self.parts.recovery = self._recovery()
            self.parts.recovery.start()  # its first iteration is the start-up pass
            server.start()
        except BaseException:
            if self.parts is not None:
                if self.parts.recovery is not None:
                    self.parts.recovery.stop()
                self.parts.watcher.stop()
                self.parts.launcher.close()
            engine.dispose()
            raise
        log.info("worker listening")
        return self.parts

    def _recovery(self) -> RecoveryLoop:
        """Reconciler + cancellation sweep on one thread (DESIGN.md, Reconciler)."""
        assert self.parts is not None
        p, profile = self.parts, self.settings.profile
        controller = IdentityController(cgroup_root=self._cgroup_root)
        reconciler = Reconciler(
            attempts=p.reader, journal=p.journal, completion=p.completion, transitions=p.runs,
            probe=HandleProbe(), controller=controller, quarantine_files=p.receipts,
            profile=profile, watch=p.watcher.add,
        )  # fmt: skip
        self._reconciler = reconciler
        sweep = CancellationSweep(
            attempts=p.reader, intents=p.runs, controller=controller, profile=profile
        )
        return RecoveryLoop(
            reconciler=reconciler, cancellation=sweep, interval_s=profile.reconcile_interval_s
        )

    def _wake(self, reconcile: bool) -> None:
        parts = self.parts
        if parts is not None and parts.recovery is not None:
            parts.recovery.wake(reconcile=reconcile)

    def _consume(self, run_id: str, attempt_id: str) -> ConsumeResult:
        assert self.parts is not None
        if self._reconciler is not None and self._reconciler.claimed(attempt_id):
            # Recovery is stopping this attempt to record ``lost``; it consumes afterwards.
            return ConsumeResult("absent")
        result = self.parts.completion.consume(run_id=run_id, attempt_id=attempt_id)
        log.info("attempt completion: %s", result.status)
        if result.status in ("absent", "quarantined"):
            # The shim exited without a usable receipt: let the reconciler decide now
            # (grace, then lost) instead of at the next cadence.
            self._wake(True)
        return result

    def _resume(self) -> None:
        """Re-watch spawned attempts whose shim lives; settle the others before serving.

        One journal page at a time, with one query for which of its attempts are still
        active (never one per entry). Settling goes through ``_consume`` exactly as the
        watcher's callback would, inline or on ``_settle_threads()`` threads, a page at a
        time (a large backlog is never held in memory). The walk meets each entry once (a
        settled entry leaves ``spawned``; nothing else moves it before the socket opens), and
        every transition is a compare-and-set, so a receipt is consumed once even when the
        reconciler or the watcher races for it.
        """
        assert self.parts is not None
        parts = self.parts
        threads = self._settle_threads()
        pool = ThreadPoolExecutor(threads, thread_name_prefix="ql-resume") if threads else None
        try:
            after: tuple[int, str] | None = None
            while True:
                page = parts.journal.page_by_state(state=SPAWNED, limit=_RESUME_PAGE, after=after)
                active = parts.reader.active_among([e.attempt_id for e in page])
                settle: list[_Pending] = []
                for entry in page:
                    live = entry.handle is not None and entry.attempt_id in active
                    if live and entry.handle is not None and shim_alive(entry.handle):
                        parts.watcher.add(entry.run_id, entry.attempt_id, entry.handle)
                    else:
                        # The shim is gone: it published its receipt (or failed to) before
                        # exiting, so there is nothing to wait for. An attempt that ended
                        # while we were away (or crashed before cleanup) replays its receipt
                        # to already_terminal and is cleaned (ADR-0007 §2.5).
                        settle.append(_Pending(entry.run_id, entry.attempt_id, entry.handle, live))
                if pool is None:
                    for pending in settle:
                        self._settle(pending)
                else:
                    list(pool.map(self._settle, settle))  # the page is settled before the next
                if len(page) < _RESUME_PAGE:
                    return
                after = (page[-1].updated_at_ms, page[-1].attempt_id)
        finally:
            if pool is not None:
                pool.shutdown()  # every submitted entry is settled before the socket opens

    def _settle_threads(self) -> int:
        """0 (inline) on SQLite; else a few threads, never more than the pool holds."""
        assert self.parts is not None
        engine = self.parts.engine
        if engine.dialect.name == "sqlite" or not isinstance(engine.pool, QueuePool):
            return 0
        return max(1, min(_SETTLE_THREADS, engine.pool.size()))

    def _settle(self, pending: _Pending) -> None:
        parts = self.parts
        assert parts is not None
        try:
            result = self._consume(pending.run_id, pending.attempt_id)
            if pending.live or result.status != "absent":
                # Settled, or still active with its shim gone: then this was what the watcher
                # does on a shim exit, and a missing receipt is the reconciler's to decide.
                return
            if pending.handle is None or not shim_alive(pending.handle):
                # The attempt ended without this receipt and no shim can publish one any
                # more: nothing is left to consume, so the entry leaves the resume set.
                parts.journal.mark_consumed(attempt_id=pending.attempt_id)
        except Exception as exc:  # the reconciler's passes retry; never content in logs
            log.warning("resume completion failed: %s", type(exc).__name__)

    def request_stop(self) -> None:
        """Ask ``serve_forever`` to return (safe from a signal handler)."""
        self._stop.set()

    def serve_forever(self) -> None:
        """Block until ``request_stop``; then shut down."""
        try:
            self._stop.wait()
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """Close the socket and stop watching; jobs and shims keep running."""
        parts, self.parts = self.parts, None
        if parts is None:
            return
        parts.server.close()
        parts.launcher.close()  # the shim zygote exits; shims and jobs keep running
        if parts.recovery is not None:
            parts.recovery.stop()
        parts.watcher.stop()
        parts.engine.dispose()


@dataclass(frozen=True, slots=True)
class _Pending:
    """A spawned journal entry to settle at start-up; ``live``: its attempt is still active."""

    run_id: str
    attempt_id: str
    handle: ProcessHandle | None
    live: bool
