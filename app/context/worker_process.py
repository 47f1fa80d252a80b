"""Composition root of the worker process (docs/design.md §2.3).

settings → engine → repositories, receipt store, journal → completion service → watcher →
launcher → control server. Shutdown closes the socket, stops watching and disposes the
engine; it never signals a job: jobs are parented by their shims, in their own sessions,
and are picked up again at the next start (watcher re-arm and the recovery loop).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, QueuePool

from app.context.worker_lease import LeaseKeeper
from app.domain.retention import GlobalBudgets
from app.execution.completion import CompletionService, ConsumeResult
from app.execution.journal_settle import SettleReport
from app.execution.worker_recovery import WorkerRecovery
from app.settings import SERVICE_START_ENV, Settings
from app.storage.durable import CANNOT_MAKE, CannotMake, read_only_error
from app.storage.engine import make_engine
from app.storage.journal_repo import JournalRepository
from app.storage.lease_repo import several_hosts
from app.storage.migrate import current_revision, head_revision, not_migrated
from app.storage.retention_repo import RetentionRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.worker.cgroups import CgroupRoot, detect, pids_problem
from app.worker.job_user import JobPolicy, job_policy
from app.worker.launcher import IdentityController, ShimLauncher
from app.worker.log_facts import LogFacts
from app.worker.log_retention import LogSweep, RetentionLoop
from app.worker.probe import HandleProbe
from app.worker.process_limit import describe as describe_process_limit
from app.worker.process_limit import held_by as process_limit_held_by
from app.worker.receipts import ReceiptStore
from app.worker.server import ControlServer
from app.worker.watcher import ShimWatcher

log = logging.getLogger(__name__)


def _first_start() -> bool:
    """False in a worker ``qinglong serve`` restarted: the warnings its first start gave of
    the settings (jobs as the service's own user, an unenforced process limit) are not
    given again, since the settings have not changed (a database outage restarts it every
    few seconds). A worker outside a serve gives them at each start."""
    return os.environ.get(SERVICE_START_ENV, "1") == "1"

# Start-up settling on PostgreSQL: each receipt costs several serial round trips and a
# commit, so a few threads (each on its own pooled connection) overlap them. SQLite has one
# writer at a time: there the backlog is settled inline, on the starting thread (on threads
# with group commit it measured no faster: bench/README.md, "Figures behind choices").
_SETTLE_THREADS = 4


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
    recovery: WorkerRecovery | None = None


def _always() -> bool:
    return True


class WorkerProcess:
    """The running worker: start, serve until told to stop, stop without touching jobs."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.parts: WorkerParts | None = None
        self._stop = threading.Event()
        self.lease: LeaseKeeper | None = None
        self._cgroup_root: CgroupRoot | None = None
        self.retention: RetentionLoop | None = None

    def start(self) -> WorkerParts:
        """Check the schema, build every part, re-arm live completion, open the socket.

        Raises: CannotMake (``receipts/``, a shard or the socket could not be made: a full
        disk, a read-only mount), besides the refusals ``qinglong worker`` names.
        """
        s = self.settings
        # Before the database and the lease: a worker that cannot run jobs as the configured
        # user refuses to start (JobUserUnavailable, one line), never runs them as itself.
        policy = self.job_policy()
        engine = make_engine(s.database_url)
        try:
            current = current_revision(engine)
            if current != head_revision():
                raise not_migrated(current)
            s.ensure_data_dir()
            # Before anything touches runs: one live worker per database (docs/worker-lease.md).
            lease = LeaseKeeper.take(settings=s, engine=engine, on_lost=self.request_stop)
            self.lease = lease
            receipts = ReceiptStore(s.receipts_dir, logs_root=s.logs_dir)
            try:
                receipts.ensure_root()
                refused = receipts.ensure_shards()  # a launch then never fsyncs the root
            except OSError as exc:  # a full disk, a read-only mount: the start's one line
                raise self._cannot_make(Path(exc.filename or s.receipts_dir), exc) from None
            read_only = read_only_error(s.receipts_dir)
            if read_only is not None:  # made before: no launch could leave its receipt
                raise CannotMake(s.receipts_dir, read_only, what=f"receipts in {s.receipts_dir}")
            if refused:
                log.warning("receipt shards not directories: their launches will fail")
            receipts.sweep_spares()  # reservations made ahead by spares that died waiting
            # Several hosts (PostgreSQL, docs/several-hosts.md): this worker reconciles, times
            # out, stops and sweeps only what its own instance launched.
            scoped = several_hosts(engine)
            journal = JournalRepository(
                engine, owner=lambda: (lease.lease.instance_id, lease.lease.epoch), scoped=scoped
            )
            runs = RunRepository(engine)
            own = lease.lease.instance_id if scoped else None
            completion = CompletionService(
                receipts=receipts, journal=journal, completions=runs,
                log_facts=LogFacts(s.logs_dir), fence=lambda: lease.fence,
            )  # fmt: skip
            watcher = ShimWatcher(
                lambda run_id, attempt_id: self._consume(run_id, attempt_id),
                lanes=_parallel_lanes(engine),
            )
            self._cgroup_root = detect(s.cgroup_root)
            no_pids = pids_problem(self._cgroup_root)
            level, line = describe_process_limit(s.job_max_processes, no_pids, policy)
            process_limit = {
                "max_processes": s.job_max_processes,
                "held_by": process_limit_held_by(s.job_max_processes, no_pids, policy),
            }
            if level < logging.WARNING or _first_start():
                log.log(level, "%s", line)
            launcher = ShimLauncher(
                journal=journal, receipts=receipts, on_spawned=watcher.add, mode=s.shim_mode,
                cgroup_root=self._cgroup_root, job_policy=policy, running=runs,
                max_processes=s.job_max_processes,
            )  # fmt: skip
            server = ControlServer(
                path=s.socket_path,
                launcher=lease.gate(launcher),
                controller=IdentityController(cgroup_root=self._cgroup_root),
                on_wake=self._wake,
                lease_facts=lease.ping_facts,
                facts={"process_limit": process_limit},
            )
            self.parts = WorkerParts(
                engine,
                journal,
                runs,
                RunReader(engine, worker_instance_id=own),
                receipts,
                completion,
                watcher,
                launcher,
                server,
            )
            self.parts.recovery = self._recovery()
            watcher.start()
            # The start-up backlog, settled back to back before serving (journal_settle.py),
            # by the same rule as the passes' sweep; then the loop's first pass.
            _log_backlog(self.parts.recovery.settle_backlog(threads=_settle_threads(engine)))
            self.parts.recovery.start()
            self.retention = self._retention(engine)
            if self.retention is not None:
                self.retention.start()
            try:
                server.start()
            except OSError as exc:  # no room for the socket file, or a read-only mount
                if exc.errno not in CANNOT_MAKE:
                    raise
                raise self._cannot_make(s.socket_path, exc) from None
        except BaseException:
            if self.retention is not None:
                self.retention.stop()
            if self.parts is not None:
                if self.parts.recovery is not None:
                    self.parts.recovery.stop()
                self.parts.watcher.stop()
                self.parts.launcher.close()
            if self.lease is not None:
                self.lease.release()
            engine.dispose()
            raise
        log.info("worker listening")
        return self.parts

    def _cannot_make(self, path: Path, exc: OSError) -> CannotMake:
        """The start's one line for ``path`` (docs/disk-full-and-readiness.md)."""
        data_dir = self.settings.data_dir
        where = "the data dir" if path.is_relative_to(data_dir) else str(path.parent)
        return CannotMake(path, exc, where=where)

    def job_policy(self) -> JobPolicy | None:
        """The checked job users (None: jobs run as the service's user; docs/job-user.md)."""
        job = self.settings.job
        if job.configured:
            return job_policy(job)
        if not _first_start():
            return None
        log.warning(
            "jobs run as the service's own user (uid %d): a job can read the data dir, the "
            "database and the key file; set QL_JOB_USER to isolate them (docs/job-user.md)",
            os.geteuid(),
        )
        return None

    def _recovery(self) -> WorkerRecovery:
        """The one recovery path (app/execution/worker_recovery.py) on this worker's parts."""
        assert self.parts is not None
        p = self.parts
        return WorkerRecovery(
            attempts=p.reader, journal=p.journal, completion=p.completion, transitions=p.runs,
            intents=p.runs, probe=HandleProbe(),
            controller=IdentityController(cgroup_root=self._cgroup_root),
            quarantine_files=p.receipts, reservations=p.receipts, profile=self.settings.profile,
            watch=p.watcher.add, may_run=self.lease.held if self.lease is not None else _always,
        )  # fmt: skip

    def _retention(self, engine: Engine) -> RetentionLoop | None:
        """The retention sweep (docs/retention.md §3), unless QL_RETENTION=off: the worker
        runs it because it owns the log files (docs/design.md §2.3)."""
        s = self.settings
        if not s.retention.enabled:
            return None
        # Several hosts: only the logs this host holds (docs/several-hosts.md §2).
        own = self.lease.lease.instance_id if self.lease and several_hosts(engine) else None
        repo = RetentionRepository(engine, worker_instance_id=own)
        d = s.profile.retention
        sweep = LogSweep(
            repo=repo,
            logs_root=s.logs_dir,
            policy=s.retention.policy(s.profile),
            budgets=GlobalBudgets(
                total_log_bytes=s.retention.total_log_bytes_of(s.profile),
                # What a run needs to start (the disk admission's rule), not the bare reserve:
                # between the two, runs would wait for space that nothing frees.
                free_reserve_bytes=s.profile.free_bytes_to_start,
            ),
            tasks_per_pass=d.tasks_per_pass,
            files_per_pass=d.files_per_pass,
        )
        # Gated like recovery: a worker whose lease is no longer surely held decides nothing.
        may_run = self.lease.held if self.lease is not None else _always
        return RetentionLoop(sweep, interval_s=s.retention.interval_of(s.profile), may_run=may_run)

    def _wake(self, reconcile: bool) -> None:
        parts = self.parts
        if parts is not None and parts.recovery is not None:
            parts.recovery.wake(reconcile=reconcile)

    def _consume(self, run_id: str, attempt_id: str) -> ConsumeResult:
        parts = self.parts
        if parts is None or parts.recovery is None:
            # Shutting down (or not started): the ending is the reconciler's at the next
            # start, from the receipt the shim left.
            return ConsumeResult("absent")
        result = parts.recovery.consume(run_id=run_id, attempt_id=attempt_id)
        if result.status == "applied" and result.task is not None and self.retention is not None:
            self.retention.kick(result.task)  # the run ended: its task may be over budget now
        return result

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
        if self.retention is not None:
            self.retention.stop()
        parts.watcher.stop()
        if self.lease is not None:
            self.lease.release()  # nothing touches runs any more: another may take over
        parts.engine.dispose()


def _parallel_lanes(engine: Engine) -> int:
    """Threads for live endings: a few, never more than the pool holds. On SQLite too: its
    one writer still takes them one at a time, but endings that meet at its gate share one
    synced commit (group commit, app/storage/uow.py), which a single thread recording them
    in turn never lets happen."""
    if not isinstance(engine.pool, QueuePool):
        return 0
    return max(1, min(_SETTLE_THREADS, engine.pool.size()))


def _log_backlog(report: SettleReport) -> None:
    """What the start-up found of the jobs launched before it (counts only, no ids)."""
    if not report.examined:
        return
    seen = report.outcomes.get
    parts = [
        (seen("recorded", 0), "ended meanwhile, recorded now from their receipts"),
        (seen("already_recorded", 0) + seen("settled", 0), "already recorded"),
        (seen("watched", 0), "still running (watched)"),
        (seen("left", 0), "ended without a receipt (the reconcile pass decides)"),
        (seen("quarantined", 0), "with an unreadable receipt (quarantined)"),
        (seen("fenced", 0) + report.undecided, "not decided yet (retried)"),
    ]
    said = "; ".join(f"{n} {what}" for n, what in parts if n)
    stopped = f"; {report.stopped} of them had to be stopped" if report.stopped else ""
    log.info("start-up: %d job(s) launched before this start: %s%s", report.examined, said, stopped)


def _settle_threads(engine: Engine) -> int:
    """Threads for the start-up backlog: 0 (inline) on SQLite, else the lanes'."""
    return 0 if engine.dialect.name == "sqlite" else _parallel_lanes(engine)
