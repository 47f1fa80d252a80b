"""The retention sweep: the worker expires logs and deletes old rows (docs/retention.md §3).

It runs in the worker because the worker owns the files of the host the jobs run on
(docs/design.md §2.3): the api only reads logs. Every step is found through the database,
never by listing a directory (files with no row are ``qinglong logs audit``'s business).

One log goes in three steps, each durable before the next:

1. ``expiring`` is committed on the attempt (the log reads as expired from here on);
2. the log, its truncation fact and the fact's temp are unlinked, and each shard directory
   touched is fsynced once;
3. ``expired`` is committed.

A kill -9 between 1 and 3 leaves ``expiring`` rows; the next pass (the first one of every
start) finishes them: unlink what is still there, fsync, ``expired``. So no file is ever left
without a row that names it, and no row claims a file that is gone. Rows go afterwards: runs
past the row budget with no log left lose their attempts, events and keys in one
transaction. A pass is bounded: at most ``files_per_pass`` logs and ``tasks_per_pass``
tasks, each read one page.

``RetentionLoop`` runs passes on one thread: at start, every ``interval_s``, and soon after a
run ended (``kick``; coalesced, at most one per ``min_gap_s``); none while ``may_run`` says
the worker's lease is not surely held. A pass that keeps failing is logged when it starts,
once a minute, and when it works again (``FailureLog``), not once a pass.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.domain.artifacts import log_relpath, truncation_fact_relpath, truncation_fact_temp_relpath
from app.domain.ids import now_ms
from app.domain.retention import (
    SOFT,
    GlobalBudgets,
    RetentionPolicy,
    TaskAnchors,
    TaskOverride,
    keep_reasons,
    plan_logs,
    rows_deletable,
)
from app.failure_log import FailureLog
from app.storage.durable import fsync_dir
from app.storage.retention_repo import RetentionRepository, SweepRecord

log = logging.getLogger(__name__)

# Candidates read per task beyond the files still allowed: the latest succeeded and failed
# run may stand first in the page and are skipped.
_PAGE_SLACK = 2


def free_bytes_of(path: Path) -> int | None:
    """Free space available to the service at ``path`` (statvfs), None when unknown or when
    the file system is read-only: no unlink could free anything there, so no free-space
    pressure (the admission keeps runs waiting and /readyz says why)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return None
    return st.f_bavail * st.f_frsize


@dataclass
class SweepReport:
    """What one pass did."""

    expired_logs: int = 0
    finished_expiring: int = 0
    deleted_runs: int = 0
    freed_bytes: int = 0
    tasks: list[str] = field(default_factory=list)


class LogSweep:
    """One bounded retention pass at a time (not thread-safe: one loop drives it)."""

    def __init__(
        self,
        *,
        repo: RetentionRepository,
        logs_root: Path,
        policy: RetentionPolicy,
        budgets: GlobalBudgets,
        tasks_per_pass: int,
        files_per_pass: int,
        clock: Callable[[], int] = now_ms,
        free_bytes: Callable[[Path], int | None] = free_bytes_of,
    ) -> None:
        self._repo = repo
        self._root = Path(logs_root)
        self._policy = policy
        self._budgets = budgets
        self._tasks_per_pass = tasks_per_pass
        self._files_per_pass = files_per_pass
        self._clock = clock
        self._free_bytes = free_bytes
        self._cursor: str | None = None
        # The global step's resume point: past logs it looked at and had to keep (a task's
        # evidence floor, say), so many such tasks cannot hide what may go behind them.
        self._global_after: str | None = None

    def run_pass(self, *, first: Sequence[str] = (), full: bool = True) -> SweepReport:
        """Finish ``expiring`` logs, then the tasks in ``first`` and (``full``) the next ones
        of the round-robin, then the oldest logs of any task while a global budget is over."""
        started = time.monotonic()
        report = SweepReport()
        report.finished_expiring = self._finish_expiring()
        files_left = self._files_per_pass - report.finished_expiring
        tasks = list(dict.fromkeys(first))[: self._tasks_per_pass]
        if full:
            tasks += self._next_tasks(exclude=tasks)
        report.tasks = tasks
        overrides = self._repo.overrides(tasks)
        now = self._clock()
        free = self._free_bytes(self._root)
        for task in tasks:
            if files_left <= 0:
                break
            policy = self._policy_of(task, overrides)
            files_left -= self._task(task, policy, now, files_left, report)
        if full or (free is not None and free < self._budgets.free_reserve_bytes):
            total = self._repo.total_log_bytes()
            if report.expired_logs:  # the task step freed some: measure what it left
                free = self._free_bytes(self._root)
            if files_left > 0:
                files_left -= self._global(total, free, now, files_left, report)
        if full or report.expired_logs or report.deleted_runs or report.finished_expiring:
            self._repo.record_sweep(
                SweepRecord(
                    at_ms=self._clock(),
                    duration_ms=int((time.monotonic() - started) * 1000),
                    expired_logs=report.expired_logs,
                    finished_expiring=report.finished_expiring,
                    deleted_runs=report.deleted_runs,
                    freed_bytes=report.freed_bytes,
                    log_bytes=self._repo.total_log_bytes(),
                    free_bytes=self._free_bytes(self._root),
                )
            )
        return report

    # -- steps ---------------------------------------------------------------------------------

    def _next_tasks(self, *, exclude: list[str]) -> list[str]:
        """The round-robin's next tasks, wrapping around once at the end of the names."""
        want = self._tasks_per_pass - len(exclude)
        out: list[str] = []
        for _ in range(2):
            if want <= 0:
                break
            more = self._repo.tasks_after(self._cursor, want)
            self._cursor = more[-1] if len(more) == want else None  # the end: start over
            out += [t for t in more if t not in exclude and t not in out]
            want -= len(more)
            if self._cursor is not None:
                break
        return out

    def _finish_expiring(self) -> int:
        ids = self._repo.expiring(limit=self._files_per_pass)
        if ids:
            self._unlink(ids)
            self._repo.mark_expired(ids)
        return len(ids)

    def _task(
        self, task: str, policy: RetentionPolicy, now: int, files_left: int, report: SweepReport
    ) -> int:
        anchors, rows_from = self._repo.anchors(
            task, keep_runs=policy.keep_runs, keep_rows=policy.keep_rows
        )
        candidates = self._repo.log_candidates(task, limit=files_left + _PAGE_SLACK)
        over = 0
        if policy.task_log_bytes is not None and candidates:
            over = self._repo.task_log_bytes(task) - policy.task_log_bytes
        plan = plan_logs(
            candidates, anchors, policy, now, over_bytes=max(over, 0), limit=files_left
        )
        done = self.expire(plan.expire, report)
        if rows_from is not None:
            rows = self._repo.row_candidates(task, before_id=rows_from, limit=self._files_per_pass)
            deletable = [
                c.run_id for c in rows if rows_deletable(c, anchors, policy, now, past_rows=True)
            ]
            report.deleted_runs += self._repo.delete_runs(deletable)
        return done

    def _global(
        self, total: int, free: int | None, now: int, files_left: int, report: SweepReport
    ) -> int:
        deficit = 0
        if self._budgets.total_log_bytes is not None:
            deficit = total - self._budgets.total_log_bytes
        if free is not None:
            deficit = max(deficit, self._budgets.free_reserve_bytes - free)
        if deficit <= 0:
            self._global_after = None
            return 0
        limit = files_left + _PAGE_SLACK
        page = self._repo.global_candidates(limit=limit, after_attempt=self._global_after)
        overrides = self._repo.overrides([task for task, _ in page])
        anchors: dict[str, TaskAnchors] = {}
        chosen: list[str] = []
        freed = 0
        looked: str | None = None  # the last candidate decided
        capped = False
        for task, c in page:
            if freed >= deficit or len(chosen) >= files_left:
                break
            if task not in anchors:
                if len(anchors) >= self._tasks_per_pass * 4:
                    capped = True  # many small tasks: the next pass goes on from here
                    break
                policy = self._policy_of(task, overrides)
                anchors[task], _ = self._repo.anchors(
                    task, keep_runs=policy.keep_runs, keep_rows=policy.keep_rows
                )
            reasons = keep_reasons(c, anchors[task], self._policy_of(task, overrides), now)
            if reasons <= SOFT and c.attempt_id is not None:
                chosen.append(c.attempt_id)
                freed += max(c.log_bytes, 1)
            looked = c.attempt_id or looked
        # Covered: the next shortfall starts from the oldest again. Not covered: the next
        # pass resumes past what this one looked at, and wraps once the end was read.
        more = capped or len(page) == limit
        self._global_after = looked if freed < deficit and more else None
        return self.expire(chosen, report)

    def expire(self, attempt_ids: Sequence[str], report: SweepReport) -> int:
        """The three steps for ``attempt_ids``; how many were marked (and are now expired)."""
        marked = self._repo.mark_expiring(attempt_ids)
        if not marked:
            return 0
        report.freed_bytes += self._unlink(marked)
        self._repo.mark_expired(marked)
        report.expired_logs += len(marked)
        return len(marked)

    def _unlink(self, attempt_ids: Iterable[str]) -> int:
        """Remove the logs (and their facts), then fsync each shard once; bytes freed.

        Plain string paths and no stat but the log's own: per file this is the whole cost
        of a pass besides the database (bench/retention.py).
        """
        freed = 0
        shards: set[str] = set()
        root = str(self._root)
        for attempt_id in attempt_ids:
            log_path = f"{root}/{log_relpath(attempt_id)}"
            try:
                freed += os.lstat(log_path).st_size
                os.unlink(log_path)
            except FileNotFoundError:
                pass
            else:
                shards.add(log_path.rsplit("/", 1)[0])
            for rel in (
                truncation_fact_relpath(attempt_id),
                truncation_fact_temp_relpath(attempt_id),
            ):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{root}/{rel}")
        for shard in sorted(shards):
            with contextlib.suppress(FileNotFoundError):
                fsync_dir(Path(shard))
        return freed

    def _policy_of(self, task: str, overrides: dict[str, TaskOverride]) -> RetentionPolicy:
        override = overrides.get(task)
        return self._policy if override is None else override.in_force(self._policy)


class RetentionLoop:
    """Runs ``LogSweep`` passes on one daemon thread: cadence, and kicks after a run ended."""

    def __init__(
        self,
        sweep: LogSweep,
        *,
        interval_s: float,
        min_gap_s: float = 1.0,
        may_run: Callable[[], bool] = lambda: True,
    ) -> None:
        # The worker's lease is surely held (docs/several-hosts.md §4): a worker whose lease
        # may be superseded starts no pass (fail closed) until it stops; kicks wait meanwhile.
        self._may_run = may_run
        self._sweep = sweep
        self._interval_s = interval_s
        self._min_gap_s = min_gap_s
        self._kicked: collections.deque[str] = collections.deque(maxlen=64)
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ql-retention", daemon=True)
        self.passes = 0
        self._failures = FailureLog(log, "retention pass", level=logging.WARNING)

    def start(self) -> None:
        """Start the thread; its first pass runs at once (it finishes ``expiring`` logs)."""
        self._thread.start()

    def kick(self, task: str) -> None:
        """A run of ``task`` ended: sweep that task soon (never blocks)."""
        with self._lock:
            self._kicked.append(task)
        self._event.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the current pass (bounded join)."""
        self._stopping.set()
        self._event.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        next_full = time.monotonic()
        while not self._stopping.is_set():
            if not self._may_run():
                self._stopping.wait(self._min_gap_s)
                continue
            self._event.clear()  # before reading the kicks: a later kick sets it again
            full = time.monotonic() >= next_full
            with self._lock:
                kicked = list(dict.fromkeys(self._kicked))
                self._kicked.clear()
            if full or kicked:
                try:
                    report = self._sweep.run_pass(first=kicked, full=full)
                except Exception as exc:  # a database hiccup ends this pass; the next retries
                    self._failures.failed(exc)
                else:
                    self._failures.succeeded()
                    self.passes += 1
                    if report.expired_logs or report.deleted_runs or report.finished_expiring:
                        log.info(
                            "retention pass: expired %d logs (%d finished) deleted %d runs",
                            report.expired_logs,
                            report.finished_expiring,
                            report.deleted_runs,
                        )
                if full:
                    next_full = time.monotonic() + self._interval_s
                self._stopping.wait(self._min_gap_s)
            if self._stopping.is_set():
                return
            self._event.wait(max(0.0, next_full - time.monotonic()))
