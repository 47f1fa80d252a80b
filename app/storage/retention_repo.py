"""Retention's database side (docs/retention.md): policies, pins, the sweep's bounded reads,
the log marks (``expiring`` → ``expired``) and the deletion of rows past the row budget.

Every read the sweep makes is bounded: a task's anchors are index walks of at most
``keep_rows`` ids, candidates are one ``limit``-row page oldest first, expiring rows one page.
Nothing here touches a file: the worker's sweep (app/worker/log_retention.py) unlinks
between ``mark_expiring`` and ``mark_expired``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Select, and_, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from app.domain.errors import ErrorCode, NotFound
from app.domain.ids import now_ms
from app.domain.journal import CONSUMED, FENCED, SPAWN_FAILED
from app.domain.retention import Candidate, TaskAnchors, TaskOverride
from app.domain.states import TERMINAL_RUN
from app.storage.tables import (
    attempts,
    idempotency_keys,
    receipt_journal,
    retention_sweeps,
    run_events,
    runs,
    task_retention,
    task_revisions,
    worker_leases,
)
from app.storage.uow import UnitOfWork, retried_on_duplicate

EXPIRING, EXPIRED = "expiring", "expired"
# Journal states whose attempt needs none of its files any more (docs/retention.md §2).
_SETTLED = (CONSUMED, SPAWN_FAILED, FENCED)
_TERMINAL = sorted(str(s) for s in TERMINAL_RUN)
SWEEPER = "logs"  # the one row of a single host (SQLite), and of any host before 0013
# Hosts whose sweeps GET /system/storage lists, newest first: far more than an installation
# has (a retired host's row goes with it, hosts_repo.retire_host).
_SWEEPS_SHOWN = 1000


@dataclass(frozen=True, slots=True)
class SweepRecord:
    """A host's last sweep's figures (GET /api/v1/system/storage); ``instance_id`` and
    ``host`` (as its lease names it) with several hosts, None on SQLite's one host."""

    at_ms: int
    duration_ms: int
    expired_logs: int
    finished_expiring: int
    deleted_runs: int
    freed_bytes: int
    log_bytes: int
    free_bytes: int | None
    instance_id: str | None = None
    host: str | None = None


@dataclass(frozen=True, slots=True)
class StorageFigures:
    """What the database says about logs and runs."""

    log_bytes: int
    logs_kept: int
    logs_expired: int
    runs_kept: int
    # Each host's last sweep, newest first (one on SQLite): a host whose sweeps stopped
    # shows as the oldest.
    sweeps: list[SweepRecord]

    @property
    def last_sweep(self) -> SweepRecord | None:
        """The newest sweep of any host."""
        return self.sweeps[0] if self.sweeps else None


def _settled(journal_state: Any) -> Any:
    return journal_state.is_(None) | journal_state.in_(_SETTLED)


_LOG_PRESENT = and_(attempts.c.log_artifact_id.is_not(None), attempts.c.log_state.is_(None))


class RetentionRepository:
    """Reads and writes for retention; each method is one unit of work."""

    def __init__(self, engine: Engine, *, worker_instance_id: str | None = None) -> None:
        self._engine = engine
        # A worker of several hosts (docs/several-hosts.md §2) expires only the logs its own
        # host holds: attempts its instance launched (and those from before migration 0008),
        # and it measures its byte budgets on those same logs (docs/retention.md §1).
        self._own: list[Any] = []
        self._instance_id = worker_instance_id
        if worker_instance_id is not None:
            self._own = [
                or_(
                    attempts.c.worker_instance_id == worker_instance_id,
                    attempts.c.worker_instance_id.is_(None),
                )
            ]

    # -- policies and pins (the api) ---------------------------------------------------------

    def get_override(self, task: str) -> TaskOverride | None:
        """The task's own policy fields, or None when it has none."""
        with UnitOfWork(self._engine, write=False) as uow:
            row = uow.conn.execute(
                select(task_retention).where(task_retention.c.task == task)
            ).first()
        return None if row is None else _override(row)

    def overrides(self, tasks: Sequence[str]) -> dict[str, TaskOverride]:
        """The policies of ``tasks`` that have one (one query)."""
        if not tasks:
            return {}
        with UnitOfWork(self._engine, write=False) as uow:
            rows = uow.conn.execute(
                select(task_retention).where(task_retention.c.task.in_(sorted(set(tasks))))
            ).all()
        return {r.task: _override(r) for r in rows}

    def put_override(self, task: str, override: TaskOverride) -> bool:
        """Store the task's policy (replacing any); True when it is new."""
        # A concurrent first put may insert the task's row first; no route deletes it, so the
        # second try's UPDATE hits it.
        return retried_on_duplicate(lambda: self._put_override_once(task, override), tries=2)

    def _put_override_once(self, task: str, override: TaskOverride) -> bool:
        values = {
            "keep_runs": override.keep_runs,
            "keep_days": override.keep_days,
            "keep_rows": override.keep_rows,
            "task_log_bytes": override.task_log_bytes,
            "updated_at_ms": now_ms(),
        }
        with UnitOfWork(self._engine) as uow:
            exists = uow.conn.execute(
                select(task_revisions.c.task).where(task_revisions.c.task == task).limit(1)
            ).first()
            if exists is None:
                raise NotFound(ErrorCode.TASK_NOT_FOUND, f"no task named {task}")
            done = uow.conn.execute(
                update(task_retention).where(task_retention.c.task == task).values(**values)
            )
            created = done.rowcount == 0
            if created:
                uow.conn.execute(insert(task_retention).values(task=task, **values))
            uow.commit()
        return created

    def set_pinned(self, run_id: str, pinned: bool) -> None:
        """Pin or unpin a run; NotFound for an unknown run."""
        with UnitOfWork(self._engine) as uow:
            done = uow.conn.execute(update(runs).where(runs.c.id == run_id).values(pinned=pinned))
            if done.rowcount != 1:
                raise NotFound(ErrorCode.RUN_NOT_FOUND, "no such run")
            uow.commit()

    # -- the sweep's reads -------------------------------------------------------------------

    def tasks_after(self, after: str | None, limit: int) -> list[str]:
        """Task names after a keyset cursor, by name (the round-robin of the sweep)."""
        t = task_revisions.c
        query = select(t.task).distinct().order_by(t.task).limit(limit)
        if after is not None:
            query = query.where(t.task > after)
        with UnitOfWork(self._engine, write=False) as uow:
            return [r[0] for r in uow.conn.execute(query)]

    def anchors(
        self, task: str, *, keep_runs: int, keep_rows: int
    ) -> tuple[TaskAnchors, str | None]:
        """The task's anchors and the id of its ``keep_rows``-th newest run (None: fewer)."""
        r = runs.c
        with UnitOfWork(self._engine, write=False) as uow:
            recent_from = None
            if keep_runs > 0:
                recent_from = _nth_newest(uow.conn, task, keep_runs)
            rows_from = _nth_newest(uow.conn, task, keep_rows)
            latest = {
                status: uow.conn.execute(
                    select(func.max(r.id)).where(r.task == task, r.status == status)
                ).scalar()
                for status in ("succeeded", "failed")
            }
        return (
            TaskAnchors(
                recent_from_id=recent_from,
                has_recent=keep_runs > 0,
                latest_succeeded_id=latest["succeeded"],
                latest_failed_id=latest["failed"],
            ),
            rows_from,
        )

    def log_candidates(self, task: str, *, limit: int) -> list[Candidate]:
        """The task's oldest logs still there, of terminal unpinned runs whose attempt's
        receipt is settled (the hard protections are filters here and checks again in
        app/domain/retention.py)."""
        query = self._present_logs(runs.c.task == task).order_by(runs.c.id, attempts.c.number)
        with UnitOfWork(self._engine, write=False) as uow:
            rows = uow.conn.execute(query.limit(limit)).all()
        return [_candidate(row, log_present=True) for row in rows]

    def global_candidates(
        self, *, limit: int, after_attempt: str | None = None
    ) -> list[tuple[str, Candidate]]:
        """The oldest logs still there over every task: (task, candidate), oldest first by
        attempt id (uuid7: creation order); ``after_attempt`` resumes past a page looked at."""
        where = () if after_attempt is None else (attempts.c.id > after_attempt,)
        query = self._present_logs(*where).order_by(attempts.c.id)
        with UnitOfWork(self._engine, write=False) as uow:
            rows = uow.conn.execute(query.limit(limit)).all()
        return [(row.task, _candidate(row, log_present=True)) for row in rows]

    def _present_logs(self, *where: Any) -> Select[Any]:
        """Logs still there that retention may expire: of terminal, unpinned runs (this
        host's, with several hosts) whose attempt's receipt is settled; ``where`` narrows."""
        j = receipt_journal.c
        return (
            select(
                runs.c.task,
                runs.c.id,
                attempts.c.id.label("attempt_id"),
                runs.c.created_at_ms,
                runs.c.status,
                runs.c.pinned,
                j.state.label("journal_state"),
                attempts.c.log_bytes,
            )
            .select_from(
                runs.join(attempts, attempts.c.run_id == runs.c.id).outerjoin(
                    receipt_journal, j.attempt_id == attempts.c.id
                )
            )
            .where(
                runs.c.status.in_(_TERMINAL),
                runs.c.pinned.is_(False),
                _LOG_PRESENT,
                _settled(j.state),
                *self._own,
                *where,
            )
        )

    def row_candidates(self, task: str, *, before_id: str, limit: int) -> list[Candidate]:
        """The task's oldest runs older than ``before_id`` (past the row budget) that are
        terminal and unpinned; ``log_present`` when any attempt still has (or is losing) a log."""
        j = receipt_journal.c
        a2 = attempts.alias("a2")
        blocking = (
            select(a2.c.id)
            .select_from(a2.outerjoin(receipt_journal, j.attempt_id == a2.c.id))
            .where(
                a2.c.run_id == runs.c.id,
                (a2.c.log_artifact_id.is_not(None) & (a2.c.log_state.is_(None)))
                | (a2.c.log_state == EXPIRING)
                | ~_settled(j.state),
            )
            .exists()
        )
        query = (
            select(runs.c.id, runs.c.created_at_ms, runs.c.status, runs.c.pinned)
            .where(
                runs.c.task == task,
                runs.c.id < before_id,
                runs.c.status.in_(_TERMINAL),
                runs.c.pinned.is_(False),
                ~blocking,
            )
            .order_by(runs.c.id)
            .limit(limit)
        )
        with UnitOfWork(self._engine, write=False) as uow:
            rows = uow.conn.execute(query).all()
        return [
            Candidate(
                run_id=r.id,
                attempt_id=None,
                created_at_ms=r.created_at_ms,
                terminal=r.status in _TERMINAL,
                pinned=bool(r.pinned),
                receipt_settled=True,
                log_present=False,
                log_bytes=0,
            )
            for r in rows
        ]

    def task_log_bytes(self, task: str) -> int:
        """Bytes of the task's logs still there (recorded sizes); with several hosts, of the
        logs this host holds, as the candidates: a host's budget is paid from its own disk."""
        query = (
            select(func.coalesce(func.sum(attempts.c.log_bytes), 0))
            .select_from(attempts.join(runs, attempts.c.run_id == runs.c.id))
            .where(runs.c.task == task, _LOG_PRESENT, *self._own)
        )
        with UnitOfWork(self._engine, write=False) as uow:
            return int(uow.conn.execute(query).scalar() or 0)

    def figures(self) -> StorageFigures:
        """Log bytes and counts, runs kept, the last sweep (GET /api/v1/system/storage)."""
        a = attempts.c
        with UnitOfWork(self._engine, write=False) as uow:
            log_bytes, kept = uow.conn.execute(
                select(func.coalesce(func.sum(a.log_bytes), 0), func.count()).where(_LOG_PRESENT)
            ).one()
            expired = uow.conn.execute(
                select(func.count()).select_from(attempts).where(a.log_state.is_not(None))
            ).scalar()
            runs_kept = uow.conn.execute(select(func.count()).select_from(runs)).scalar()
            # The host its instance's newest lease names: an installation from before
            # migration 0008 keeps an old single-slot row of the same instance too.
            host = (
                select(worker_leases.c.host)
                .where(worker_leases.c.instance_id == retention_sweeps.c.sweeper)
                .order_by(worker_leases.c.acquired_at_ms.desc())
                .limit(1)
                .scalar_subquery()
            )
            rows = uow.conn.execute(
                select(retention_sweeps, host.label("host"))
                .order_by(retention_sweeps.c.at_ms.desc(), retention_sweeps.c.sweeper)
                .limit(_SWEEPS_SHOWN)
            ).all()
        return StorageFigures(
            log_bytes=int(log_bytes),
            logs_kept=int(kept),
            logs_expired=int(expired or 0),
            runs_kept=int(runs_kept or 0),
            sweeps=[_sweep(row) for row in rows],
        )

    def total_log_bytes(self) -> int:
        """Bytes of every log still there (recorded sizes); with several hosts, of the logs
        this host holds (those of no recorded host included, as in the candidates)."""
        query = select(func.coalesce(func.sum(attempts.c.log_bytes), 0)).where(
            _LOG_PRESENT, *self._own
        )
        with UnitOfWork(self._engine, write=False) as uow:
            return int(uow.conn.execute(query).scalar() or 0)

    def expiring(self, *, limit: int) -> list[str]:
        """Attempts whose log is ``expiring`` (a sweep died between its marks), by id."""
        with UnitOfWork(self._engine, write=False) as uow:
            rows = uow.conn.execute(
                select(attempts.c.id)
                .where(attempts.c.log_state == EXPIRING, *self._own)
                .order_by(attempts.c.id)
                .limit(limit)
            ).all()
        return [r[0] for r in rows]

    # -- the sweep's writes ------------------------------------------------------------------

    def mark_expiring(self, attempt_ids: Sequence[str]) -> list[str]:
        """Mark the logs ``expiring`` (step 1 of 3) where still there and allowed; the ids
        marked. The runs are locked first (FOR UPDATE on PostgreSQL, the write lock on
        SQLite), so a pin committed before this wins and one after it finds the log going."""
        if not attempt_ids:
            return []
        ids = sorted(set(attempt_ids))
        j = receipt_journal.c
        with UnitOfWork(self._engine) as uow:
            allowed = uow.conn.execute(
                select(attempts.c.id)
                .select_from(
                    attempts.join(runs, runs.c.id == attempts.c.run_id).outerjoin(
                        receipt_journal, j.attempt_id == attempts.c.id
                    )
                )
                .where(
                    attempts.c.id.in_(ids),
                    runs.c.status.in_(_TERMINAL),
                    runs.c.pinned.is_(False),
                    _LOG_PRESENT,
                    _settled(j.state),
                )
                .with_for_update(of=runs)
            ).all()
            marked = [r[0] for r in allowed]
            if marked:
                uow.conn.execute(
                    update(attempts)
                    .where(attempts.c.id.in_(marked), attempts.c.log_state.is_(None))
                    .values(log_state=EXPIRING, log_expired_at_ms=now_ms())
                )
            uow.commit()
        return marked

    def mark_expired(self, attempt_ids: Sequence[str]) -> int:
        """``expiring`` → ``expired`` (step 3: the unlinks are durable); rows moved."""
        if not attempt_ids:
            return 0
        with UnitOfWork(self._engine) as uow:
            done = uow.conn.execute(
                update(attempts)
                .where(
                    attempts.c.id.in_(sorted(set(attempt_ids))), attempts.c.log_state == EXPIRING
                )
                .values(log_state=EXPIRED)
            )
            uow.commit()
        return int(done.rowcount or 0)

    def delete_runs(self, run_ids: Sequence[str]) -> int:
        """Delete runs with their attempts, events, idempotency keys and settled journal rows,
        in one transaction; only runs still terminal, unpinned and without a log left."""
        if not run_ids:
            return 0
        ids = sorted(set(run_ids))
        with UnitOfWork(self._engine) as uow:
            conn = uow.conn
            locked = [
                r[0]
                for r in conn.execute(
                    select(runs.c.id)
                    .where(
                        runs.c.id.in_(ids),
                        runs.c.status.in_(_TERMINAL),
                        runs.c.pinned.is_(False),
                    )
                    .with_for_update()
                )
            ]
            if locked:
                # Re-checked under the lock: no log there or going, every journal row settled.
                j = receipt_journal.c
                blocked = {
                    r[0]
                    for r in conn.execute(
                        select(attempts.c.run_id)
                        .select_from(
                            attempts.outerjoin(receipt_journal, j.attempt_id == attempts.c.id)
                        )
                        .where(
                            attempts.c.run_id.in_(locked),
                            _LOG_PRESENT | (attempts.c.log_state == EXPIRING) | ~_settled(j.state),
                        )
                    )
                }
                locked = [r for r in locked if r not in blocked]
            if locked:
                attempt_ids = select(attempts.c.id).where(attempts.c.run_id.in_(locked))
                conn.execute(
                    delete(receipt_journal).where(receipt_journal.c.attempt_id.in_(attempt_ids))
                )
                conn.execute(delete(run_events).where(run_events.c.run_id.in_(locked)))
                conn.execute(delete(idempotency_keys).where(idempotency_keys.c.run_id.in_(locked)))
                conn.execute(delete(attempts).where(attempts.c.run_id.in_(locked)))
                conn.execute(delete(runs).where(runs.c.id.in_(locked)))
            uow.commit()
        return len(locked)

    def record_sweep(self, record: SweepRecord) -> None:
        """Replace this host's last sweep's figures: the row ``logs`` on SQLite's one host,
        the row of its instance with several (which also drops the row ``logs`` an older
        build left, one no host owns now)."""
        values = {
            "at_ms": record.at_ms,
            "duration_ms": record.duration_ms,
            "expired_logs": record.expired_logs,
            "finished_expiring": record.finished_expiring,
            "deleted_runs": record.deleted_runs,
            "freed_bytes": record.freed_bytes,
            "log_bytes": record.log_bytes,
            "free_bytes": record.free_bytes,
        }
        t = retention_sweeps.c
        sweeper = self._instance_id or SWEEPER
        with UnitOfWork(self._engine) as uow:
            if sweeper != SWEEPER:
                uow.conn.execute(delete(retention_sweeps).where(t.sweeper == SWEEPER))
            done = uow.conn.execute(
                update(retention_sweeps).where(t.sweeper == sweeper).values(**values)
            )
            if done.rowcount == 0:
                try:
                    uow.conn.execute(insert(retention_sweeps).values(sweeper=sweeper, **values))
                except IntegrityError:  # pragma: no cover - one sweeper per host
                    return
            uow.commit()


def _sweep(row: Any) -> SweepRecord:
    return SweepRecord(
        at_ms=row.at_ms, duration_ms=row.duration_ms, expired_logs=row.expired_logs,
        finished_expiring=row.finished_expiring, deleted_runs=row.deleted_runs,
        freed_bytes=row.freed_bytes, log_bytes=row.log_bytes, free_bytes=row.free_bytes,
        instance_id=None if row.sweeper == SWEEPER else row.sweeper, host=row.host,
    )  # fmt: skip


def _nth_newest(conn: Any, task: str, n: int) -> str | None:
    row = conn.execute(
        select(runs.c.id)
        .where(runs.c.task == task)
        .order_by(runs.c.id.desc())
        .offset(n - 1)
        .limit(1)
    ).first()
    return None if row is None else str(row[0])


def _override(row: Any) -> TaskOverride:
    return TaskOverride(
        keep_runs=row.keep_runs,
        keep_days=row.keep_days,
        keep_rows=row.keep_rows,
        task_log_bytes=row.task_log_bytes,
    )


def _candidate(row: Any, *, log_present: bool) -> Candidate:
    return Candidate(
        run_id=row.id,
        attempt_id=row.attempt_id,
        created_at_ms=row.created_at_ms,
        terminal=row.status in _TERMINAL,
        pinned=bool(row.pinned),
        receipt_settled=row.journal_state is None or row.journal_state in _SETTLED,
        log_present=log_present,
        log_bytes=int(row.log_bytes or 0),
    )
