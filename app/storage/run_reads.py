"""Read side of runs: single reads and keyset pages (``limit + 1``, never OFFSET)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Engine,
    Integer,
    Row,
    Select,
    and_,
    bindparam,
    case,
    exists,
    false,
    func,
    or_,
    select,
    text,
    true,
)

from app.domain.errors import ErrorCode, NotFound
from app.domain.events import attempt_event
from app.domain.ids import now_ms, uuid7_floor
from app.domain.model import Attempt, CancelIntent, LogInfo, Page, ProcessHandle, Run, RunEvent
from app.domain.states import TERMINAL_RUN, AttemptStatus, RunStatus
from app.storage.cursor import decode_cursor, encode_cursor
from app.storage.one_statement import OneStatementRead
from app.storage.tables import (
    ACTIVE_ATTEMPT,
    READY_PAGE_WHERE,
    RETRY_WAIT_WHERE,
    attempts,
    run_events,
    runs,
    task_revisions,
)
from app.storage.uow import UnitOfWork

if TYPE_CHECKING:  # psycopg is imported only where PostgreSQL is used
    from app.storage.async_reads import AsyncReads


class RunPageShape(NamedTuple):
    """Which filters a runs page has: one prepared statement for each combination."""

    task: bool
    status: bool
    schedule: bool
    since: bool
    until: bool
    after: bool


@dataclass(frozen=True, slots=True)
class DispatchCandidate:
    """A queued run whose latest attempt is claimed, in dispatch order."""

    run_id: str
    attempt_id: str
    attempt_number: int
    version: int
    task: str
    revision: int
    priority: int
    created_at_ms: int
    attempt_created_at_ms: int
    # Held behind an older run of its schedule that has not ended (docs/schedules.md §5):
    # the dispatcher passes it over, as a task at its budget.
    held: bool = False


@dataclass(frozen=True, slots=True)
class ActiveAttempt:
    """An attempt in starting or running, as the reconciler and worker need it."""

    run_id: str
    attempt_id: str
    number: int
    status: str
    run_status: str
    handle: ProcessHandle | None
    handle_invalid: bool
    deadline_at_ms: int | None
    cancel_reason: str | None
    log_artifact_id: str | None
    created_at_ms: int


def attempt_from_row(row: Row[Any]) -> Attempt:
    """Map an ``attempts`` row to the domain value (no handle, no digest)."""
    log = None
    expired = row.log_state is not None  # expiring or expired: the file is (being) removed
    if row.log_bytes is not None or expired:
        log = LogInfo(
            bytes=row.log_bytes or 0,
            truncated=bool(row.log_truncated),
            dropped_bytes=row.log_dropped_bytes or 0,
            reason=row.log_truncation_reason,
            dropped_at=row.log_dropped_at,
            expired=expired,
            expired_at_ms=row.log_expired_at_ms,
        )
    return Attempt(
        id=row.id,
        run_id=row.run_id,
        number=row.number,
        status=row.status,
        executor=row.executor,
        created_at_ms=row.created_at_ms,
        started_at_ms=row.started_at_ms,
        finished_at_ms=row.finished_at_ms,
        exit_code=row.exit_code,
        signal=row.signal,
        error_code=row.error_code,
        deadline_at_ms=row.deadline_at_ms,
        log_artifact_id=row.log_artifact_id,
        callback_sequence=row.callback_sequence,
        log=log,
        worker_instance_id=getattr(row, "worker_instance_id", None),
        not_before_ms=getattr(row, "not_before_ms", None),
    )


def run_from_rows(run_row: Row[Any], attempt_row: Row[Any] | None) -> Run:
    """Map a ``runs`` row (and its latest attempt row) to the domain value."""
    cancel = None
    if run_row.cancel_reason is not None:
        cancel = CancelIntent(reason=run_row.cancel_reason, at_ms=run_row.cancel_requested_at_ms)
    return Run(
        id=run_row.id,
        task=run_row.task,
        revision=run_row.revision,
        status=run_row.status,
        priority=run_row.priority,
        version=run_row.version,
        created_at_ms=run_row.created_at_ms,
        started_at_ms=run_row.started_at_ms,
        finished_at_ms=run_row.finished_at_ms,
        cancel=cancel,
        latest_attempt=attempt_from_row(attempt_row) if attempt_row is not None else None,
        trigger_kind=run_row.trigger_kind or "manual",
        schedule=run_row.schedule_name,
        slot_ms=run_row.slot_ms,
        rerun_of=getattr(run_row, "rerun_of", None),
        pinned=bool(run_row.pinned),
    )


_RUN_WITH_LATEST = runs.join(
    attempts, and_(attempts.c.run_id == runs.c.id, attempts.c.number == runs.c.latest_attempt)
)
_ATTEMPT_COLUMNS = [c.label(f"a_{c.name}") for c in attempts.c]
# Attempts in starting or running, with what the reconciler needs of their run.
_ACTIVE = (
    select(attempts, runs.c.status.label("run_status"), runs.c.cancel_reason)
    .join(runs, runs.c.id == attempts.c.run_id)
    .where(ACTIVE_ATTEMPT)
)

# A page's size as a literal of the statement, not a bind: PostgreSQL's generic plan of
# ``ORDER BY id LIMIT $n`` guesses a tenth of the table and walks the primary key through
# every ended attempt; with the size in the text it walks a partial index of the active ones
# (tests/storage/test_partial_indexes.py). A few sizes are used, so a few statements.
PAGE_LIMIT: BindParameter[int] = bindparam("page_limit", type_=Integer, literal_execute=True)


def own_attempts(worker_instance_id: str) -> ColumnElement[bool]:
    """The attempts a worker of several hosts sees: its instance's, and those from before
    migration 0008, which name none (docs/several-hosts.md §2)."""
    return or_(
        attempts.c.worker_instance_id == worker_instance_id,
        attempts.c.worker_instance_id.is_(None),
    )


def active_page(*where: ColumnElement[bool]) -> Select[Any]:
    """The active attempts (``_ACTIVE``) meeting ``where``, by id, a page of ``page_limit``."""
    return _ACTIVE.where(*where).order_by(attempts.c.id).limit(PAGE_LIMIT)


_RUN_NAMES = tuple(c.name for c in runs.c)
_ATTEMPT_NAMES = tuple(c.name for c in attempts.c)


def _split(row: Row[Any] | tuple[Any, ...]) -> tuple[Any, Any]:
    # Rows of ``select(runs, *_ATTEMPT_COLUMNS)``: the run's columns, then the attempt's, in
    # table order. Positional slicing, not a keyed lookup per column (list-page profile).
    values = tuple(row)
    cut = len(_RUN_NAMES)
    run_part = SimpleNamespace(**dict(zip(_RUN_NAMES, values[:cut], strict=True)))
    attempt_part = SimpleNamespace(**dict(zip(_ATTEMPT_NAMES, values[cut:], strict=True)))
    return run_part, attempt_part


# Concurrency budgets (docs/concurrency-budgets.md §2): a run counts while it is dispatching
# (its attempt starting) or running; ix_runs_status_id and ix_runs_task_status_id serve the
# counts, so they never scan the queue.
ACTIVE_RUN = (RunStatus.DISPATCHING.value, RunStatus.RUNNING.value)
# Equalities, not IN: the counts are also one-statement reads, compiled once (an expanding
# IN is compiled per call).
_RUN_ACTIVE = or_(*(runs.c.status == s for s in ACTIVE_RUN))
COUNT_ACTIVE = select(func.count()).select_from(runs).where(_RUN_ACTIVE)
# The binds are named apart from every column: runs_repo's T1 also puts these counts in its
# UPDATE statement (one_step.py), whose SET columns come from its parameters' names.
COUNT_TASK_ACTIVE = (
    select(func.count())
    .select_from(runs)
    .where(runs.c.task == bindparam("count_task"), _RUN_ACTIVE)
)
_NEXT_RETRY = (
    select(runs.c.not_before_ms)
    .where(text(RETRY_WAIT_WHERE), runs.c.not_before_ms > bindparam("after"))
    .order_by(runs.c.not_before_ms)
    .limit(1)
)
COUNT_QUEUED = select(func.count()).select_from(runs).where(runs.c.status == RunStatus.QUEUED.value)
# One host's share (docs/several-hosts.md §3): its attempts starting or running
# (ix_attempts_worker_instance_id_status, whose predicate the query repeats as its own).
COUNT_HOST_ACTIVE = (
    select(func.count())
    .select_from(attempts)
    .where(
        attempts.c.worker_instance_id == bindparam("count_instance"),
        ACTIVE_ATTEMPT,
    )
)

# A run with hold_from_slot_ms is held while a run of its schedule with a slot in
# [hold_from_slot_ms, its slot) has not ended: a range of the unique index on (schedule_id,
# slot_ms), a few rows (the runs that were active when it was created). Once false it stays
# false: no run of the schedule can later take a slot before its own.
_OLDER = runs.alias("older")
HELD = case(
    (runs.c.hold_from_slot_ms.is_(None), false()),
    else_=exists().where(
        _OLDER.c.schedule_id == runs.c.schedule_id,
        _OLDER.c.slot_ms >= runs.c.hold_from_slot_ms,
        _OLDER.c.slot_ms < runs.c.slot_ms,
        # Equalities, not IN: an expanding IN is not compiled once (OneStatementRead).
        or_(*(_OLDER.c.status == s.value for s in RunStatus if s not in TERMINAL_RUN)),
    ),
)


def run_page_query(shape: RunPageShape) -> Select[Any]:
    """A page of ``GET /api/v1/runs`` with the filters ``shape`` names, newest first: each
    combination walks an index in id order (tests/storage/test_run_list_plans.py)."""
    query = select(runs, *_ATTEMPT_COLUMNS).select_from(_RUN_WITH_LATEST)
    if shape.task:
        query = query.where(runs.c.task == bindparam("task"))
    if shape.status:
        query = query.where(runs.c.status == bindparam("status"))
    if shape.schedule:
        # ix_runs_schedule_name_id (migration 0014); its predicate, schedule_name IS NOT
        # NULL, follows from the equality on both engines.
        query = query.where(runs.c.schedule_name == bindparam("schedule"))
    if shape.since:
        query = query.where(
            runs.c.id >= bindparam("since_id"), runs.c.created_at_ms >= bindparam("since")
        )
    if shape.until:
        # No id bound: a run's id may be made a little after its created time (later in its
        # millisecond's order, or after its process's clock stepped back), so only the
        # created time says which side of ``until`` it is on.
        query = query.where(runs.c.created_at_ms < bindparam("until"))
    if shape.after:
        query = query.where(runs.c.id < bindparam("last_id"))
    return query.order_by(runs.c.id.desc()).limit(bindparam("limit"))


class RunReader:
    """Read-only queries over runs, attempts and events."""

    def __init__(
        self,
        engine: Engine,
        *,
        async_reads: AsyncReads | None = None,
        worker_instance_id: str | None = None,
    ) -> None:
        self._engine = engine
        self._async_reads = async_reads
        # A worker of several hosts (docs/several-hosts.md §2) sees only the active attempts
        # its instance launched (and those from before migration 0008, which name none).
        self._host_budget: str | None = None  # see ``budget_per_host``
        self._own: list[ColumnElement[bool]] = []
        if worker_instance_id is not None:
            self._own = [own_attempts(worker_instance_id)]
        self._one_run = OneStatementRead(
            engine,
            select(runs, *_ATTEMPT_COLUMNS)
            .select_from(_RUN_WITH_LATEST)
            .where(runs.c.id == bindparam("run_id")),
        )
        self._run_pages: dict[RunPageShape, OneStatementRead] = {}
        self._dispatch_pages: dict[bool, OneStatementRead] = {}
        # The budget counts every dispatch pass asks: one statement each, no transaction.
        self._count_active = OneStatementRead(engine, COUNT_ACTIVE)
        self._count_task_active = OneStatementRead(engine, COUNT_TASK_ACTIVE)
        self._count_host_active = OneStatementRead(engine, COUNT_HOST_ACTIVE)
        self._queued_held = OneStatementRead(
            engine, select(runs.c.status, HELD).where(runs.c.id == bindparam("run_id"))
        )

    def _run_page(self, shape: RunPageShape) -> OneStatementRead:
        """The list-page statement for one combination of filters (and cursor)."""
        read = self._run_pages.get(shape)
        if read is None:
            query = run_page_query(shape)
            read = self._run_pages.setdefault(shape, OneStatementRead(self._engine, query))
        return read

    def _dispatch_page(self, *, after: bool) -> OneStatementRead:
        """The dispatch-candidates statement, first page or after a keyset cursor.

        The page is chosen from ``runs`` alone (ix_runs_ready_page holds exactly its rows in
        its order, so the walk stops after ``limit + 1``), and only its rows are joined to
        their latest attempt and revision (``_page_joins``). PostgreSQL plans a join of the
        whole queue on statistics, and statistics that call the queue tiny (a fresh
        database, a burst after a long history of ended runs) made it join and sort every
        queued run for every page: 95 ms per page at 1,000 queued runs, and the trivial-run
        bench fell from 50 to 22 runs/s (bench/README.md). The attempt's own conditions come
        back as ``ready`` instead of filtering the join: a queued run's latest attempt is
        claimed by construction (every path that queues a run inserts it), so they only
        guard, and a row that fails them still moves the cursor.
        """
        read = self._dispatch_pages.get(after)
        if read is None:
            chosen = select(
                runs.c.id,
                runs.c.version,
                runs.c.task,
                runs.c.revision,
                runs.c.priority,
                runs.c.created_at_ms,
                runs.c.latest_attempt,
                HELD.label("held"),
            ).where(
                # Queued, not waiting for a retry (docs/retries.md §2): ix_runs_ready_page's
                # own predicate, the status a literal (tables.py says why).
                text(READY_PAGE_WHERE),
                runs.c.cancel_reason.is_(None),
            )
            if after:
                prio: Any = bindparam("prio")
                created: Any = bindparam("created")
                chosen = chosen.where(
                    # Redundant with the OR, and the one term an index can start from: the
                    # walk begins at the cursor's priority, not at the top of the queue.
                    runs.c.priority <= prio,
                    or_(
                        runs.c.priority < prio,
                        and_(runs.c.priority == prio, runs.c.created_at_ms > created),
                        and_(
                            runs.c.priority == prio,
                            runs.c.created_at_ms == created,
                            runs.c.id > bindparam("run_id"),
                        ),
                    ),
                )
            page = (
                chosen.order_by(runs.c.priority.desc(), runs.c.created_at_ms, runs.c.id)
                .limit(bindparam("limit"))
                .subquery("page")
            )
            attempt, revision, joined = self._page_joins(page)
            ready = case(
                (
                    and_(
                        attempt.status == AttemptStatus.CLAIMED.value,
                        attempt.executor == "local_process",
                        revision.task.is_not(None),
                        # And the attempt's own instant (the run's mark is cleared only once
                        # it passed; T1 checks it again).
                        or_(
                            attempt.not_before_ms.is_(None),
                            attempt.not_before_ms <= bindparam("now"),
                        ),
                    ),
                    true(),
                ),
                else_=false(),
            )
            query = (
                select(
                    page.c.id,
                    page.c.version,
                    page.c.task,
                    page.c.revision,
                    page.c.priority,
                    page.c.created_at_ms,
                    attempt.id,
                    attempt.number,
                    attempt.created_at_ms,
                    page.c.held,
                    ready.label("ready"),
                )
                .select_from(joined)
                .order_by(page.c.priority.desc(), page.c.created_at_ms, page.c.id)
            )
            read = self._dispatch_pages.setdefault(after, OneStatementRead(self._engine, query))
        return read

    def _page_joins(self, page: Any) -> tuple[Any, Any, Any]:
        """The page's rows joined to their latest attempt and revision: the attempt's and
        the revision's columns, and the FROM clause.

        On PostgreSQL each join is a LATERAL lookup of one row (LIMIT 1 keeps the planner
        from flattening it into an ordinary join), so the only plan is an index probe per
        page row: with fresh statistics the generic plan of the hot statement hashed every
        attempt ever written to join seventeen rows. SQLite joins by nested loops anyway.
        """
        attempt_on = and_(
            attempts.c.run_id == page.c.id, attempts.c.number == page.c.latest_attempt
        )
        revision_on = and_(
            task_revisions.c.task == page.c.task, task_revisions.c.revision == page.c.revision
        )
        if self._engine.dialect.name != "postgresql":
            joined = page.outerjoin(attempts, attempt_on).outerjoin(task_revisions, revision_on)
            return attempts.c, task_revisions.c, joined
        attempt = (
            select(
                attempts.c.id,
                attempts.c.number,
                attempts.c.created_at_ms,
                attempts.c.status,
                attempts.c.executor,
                attempts.c.not_before_ms,
            )
            .where(attempt_on)
            .limit(1)
            .lateral("latest")
        )
        revision = select(task_revisions.c.task).where(revision_on).limit(1).lateral("rev")
        joined = page.outerjoin(attempt, true()).outerjoin(revision, true())
        return attempt.c, revision.c, joined

    def budget_per_host(self, worker_instance_id: str) -> None:
        """``active_count()`` counts this host's active attempts (PostgreSQL, several hosts:
        QL_MAX_RUNNING is per host, docs/several-hosts.md §3), as T1's check does."""
        if self._engine.dialect.name == "postgresql":
            self._host_budget = worker_instance_id

    def get_run(self, run_id: str) -> Run:
        """One run with its latest attempt; NotFound otherwise."""
        return _the_run(self._one_run.rows({"run_id": run_id}))

    async def get_run_async(self, run_id: str) -> Run:
        """``get_run`` on the event loop's own connections (PostgreSQL; see async_reads), or
        in a worker thread when this reader has none."""
        if self._async_reads is None:
            return await asyncio.to_thread(self.get_run, run_id)
        return _the_run(await self._async_reads.rows(self._one_run, {"run_id": run_id}))

    def list_runs(
        self,
        *,
        task: str | None,
        status: str | None,
        limit: int,
        cursor: str | None,
        schedule: str | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
    ) -> Page[Run]:
        """Newest first (UUIDv7 order), filtered by task, status, the name of the schedule
        that started the run, and its ``created_at_ms`` in ``[since_ms, until_ms)``; one
        keyset page. The cursor is the last run's id: a position in that one order, so it
        holds under any filters."""
        params: dict[str, Any] = {
            "task": task, "status": status, "schedule": schedule, "limit": limit + 1,
        }  # fmt: skip
        if since_ms is not None:
            # A run's id is made at its created_at_ms or later (app/domain/ids.py: a process
            # keeps its ids in order, never earlier than asked), so every run created at
            # since_ms or later has an id at or above this one: the index's range starts
            # there, and the created time decides at each row.
            params |= {"since": since_ms, "since_id": uuid7_floor(since_ms)}
        if until_ms is not None:
            params["until"] = until_ms
        if cursor is not None:
            (params["last_id"],) = decode_cursor("runs", cursor, (str,))
        shape = RunPageShape(
            task is not None, status is not None, schedule is not None,
            since_ms is not None, until_ms is not None, cursor is not None,
        )  # fmt: skip
        rows = self._run_page(shape).rows(params)
        items = [run_from_rows(*_split(r)) for r in rows[:limit]]
        next_cursor = encode_cursor("runs", [items[-1].id]) if len(rows) > limit else None
        return Page(items=items, next_cursor=next_cursor)

    def list_attempts(self, run_id: str) -> list[Attempt]:
        """All attempts of a run, by number; NotFound for an unknown run."""
        with UnitOfWork(self._engine, write=False) as uow:
            rows = uow.conn.execute(
                select(attempts).where(attempts.c.run_id == run_id).order_by(attempts.c.number)
            ).all()
        if not rows:
            raise NotFound(ErrorCode.RUN_NOT_FOUND, "no such run")
        return [attempt_from_row(r) for r in rows]

    def get_attempt(self, run_id: str, number: int) -> Attempt:
        """One attempt by run and number; RUN_NOT_FOUND when the run itself is unknown (as
        every other read of a run says it), ATTEMPT_NOT_FOUND when only the attempt is."""
        with UnitOfWork(self._engine, write=False) as uow:
            row = uow.conn.execute(
                select(attempts).where(attempts.c.run_id == run_id, attempts.c.number == number)
            ).first()
            if row is None:
                exists = uow.conn.execute(select(runs.c.id).where(runs.c.id == run_id)).first()
                if exists is None:
                    raise NotFound(ErrorCode.RUN_NOT_FOUND, "no such run")
        if row is None:
            raise NotFound(ErrorCode.ATTEMPT_NOT_FOUND, "no such attempt")
        return attempt_from_row(row)

    def list_events(
        self, run_id: str, *, cursor: str | None = None, limit: int = 200
    ) -> Page[RunEvent]:
        """Events in ``seq`` order, one keyset page (after the cursor's ``seq``)."""
        after_seq = 0
        if cursor is not None:
            (after_seq,) = decode_cursor("events", cursor, (int,))
        with UnitOfWork(self._engine, write=False) as uow:
            exists = uow.conn.execute(select(runs.c.id).where(runs.c.id == run_id)).first()
            if exists is None:
                raise NotFound(ErrorCode.RUN_NOT_FOUND, "no such run")
            rows = uow.conn.execute(
                select(run_events)
                .where(run_events.c.run_id == run_id, run_events.c.seq > after_seq)
                .order_by(run_events.c.seq)
                .limit(limit + 1)
            ).all()
        items = [
            RunEvent(
                run_id=r.run_id, seq=r.seq, type=r.type, at_ms=r.at_ms, data=json.loads(r.data)
            )
            for r in rows[:limit]
        ]
        next_cursor = encode_cursor("events", [items[-1].seq]) if len(rows) > limit else None
        return Page(items=items, next_cursor=next_cursor)

    def dispatch_candidates(
        self, *, limit: int, cursor: str | None = None
    ) -> Page[DispatchCandidate]:
        """Queued runs without cancel intent whose latest attempt is claimed, in dispatch order."""
        params: dict[str, Any] = {"limit": limit + 1, "now": now_ms()}
        if cursor is not None:
            prio, created, run_id = decode_cursor("dispatch", cursor, (int, int, str))
            params |= {"prio": prio, "created": created, "run_id": run_id}
        rows = self._dispatch_page(after=cursor is not None).rows(params)
        items = [
            DispatchCandidate(
                run_id=run_id,
                attempt_id=attempt_id,
                attempt_number=number,
                version=version,
                task=task,
                revision=revision,
                priority=priority,
                created_at_ms=created_at_ms,
                attempt_created_at_ms=attempt_created_at_ms,
                held=bool(held),
            )
            for (
                run_id,
                version,
                task,
                revision,
                priority,
                created_at_ms,
                attempt_id,
                number,
                attempt_created_at_ms,
                held,
                ready,
            ) in rows[:limit]
            if ready
        ]
        next_cursor = None
        if len(rows) > limit:
            # The page's last run, listed or not: the walk goes on past a run its guards
            # left out.
            last = rows[limit - 1]
            next_cursor = encode_cursor("dispatch", [last[4], last[5], last[0]])
        return Page(items=items, next_cursor=next_cursor)

    def next_retry_at_ms(self, *, after_ms: int) -> int | None:
        """The earliest ``not_before_ms`` of a run waiting for a retry, later than
        ``after_ms``: one range lookup on ix_runs_retry_wait, so the dispatch loop sleeps
        until it (docs/retries.md §2) instead of polling."""
        with UnitOfWork(self._engine, write=False) as uow:
            at = uow.conn.execute(_NEXT_RETRY, {"after": after_ms}).scalar()
        return None if at is None else int(at)

    def active_attempts(self, *, limit: int, after_id: str | None = None) -> list[ActiveAttempt]:
        """Attempts in starting or running, by id, after ``after_id`` (a resume cursor)."""
        return self._active_page(limit, after_id)

    def stop_candidates(
        self, *, now_ms: int, limit: int, after_id: str | None = None
    ) -> list[ActiveAttempt]:
        """Active attempts whose deadline passed or whose run has a cancel intent, by id."""
        return self._active_page(
            limit,
            after_id,
            (attempts.c.deadline_at_ms <= now_ms) | runs.c.cancel_reason.is_not(None),
        )

    def active_count(self, task: str | None = None) -> int:
        """Runs dispatching or running now (of ``task`` when given): a budget pre-check."""
        if task is None and self._host_budget is not None:
            rows = self._count_host_active.rows({"count_instance": self._host_budget})
        elif task is None:
            rows = self._count_active.rows({})
        else:
            rows = self._count_task_active.rows({"count_task": task})
        return int(rows[0][0])

    def queued_held(self, run_id: str) -> tuple[bool, bool]:
        """(whether the run is queued now, whether it waits behind an older run of its
        schedule: ``HELD``, T1's rule), in one statement."""
        row = self._queued_held.rows({"run_id": run_id})
        return (False, False) if not row else (row[0][0] == RunStatus.QUEUED.value, bool(row[0][1]))

    def starting_since_ms(self, run_id: str) -> int | None:
        """When the run's latest attempt entered ``starting`` (T1), from its event."""
        with UnitOfWork(self._engine, write=False) as uow:
            at = uow.conn.execute(
                select(func.max(run_events.c.at_ms)).where(
                    run_events.c.run_id == run_id,
                    run_events.c.type == attempt_event(AttemptStatus.STARTING),
                )
            ).scalar()
        return None if at is None else int(at)

    def active_attempt(self, attempt_id: str) -> ActiveAttempt | None:
        """One attempt if it is still starting or running."""
        return self.active_among([attempt_id]).get(attempt_id)

    def active_among(self, attempt_ids: list[str]) -> dict[str, ActiveAttempt]:
        """Those of ``attempt_ids`` still starting or running, by id: one query for a page."""
        if not attempt_ids:
            return {}
        found = self._active(_ACTIVE.where(attempts.c.id.in_(attempt_ids), *self._own))
        return {a.attempt_id: a for a in found}

    def _active_page(
        self, limit: int, after_id: str | None, *where: ColumnElement[bool]
    ) -> list[ActiveAttempt]:
        query = active_page(*where, *self._own)
        if after_id is not None:
            query = query.where(attempts.c.id > after_id)
        return self._active(query, {PAGE_LIMIT.key: limit})

    def _active(
        self, query: Select[Any], params: dict[str, Any] | None = None
    ) -> list[ActiveAttempt]:
        with UnitOfWork(self._engine, write=False) as uow:
            rows = uow.conn.execute(query, params or {}).all()
        return [_active_from_row(r) for r in rows]


def _the_run(rows: list[tuple[Any, ...]]) -> Run:
    """The run of GET one run's statement rows; NotFound when there is none."""
    if not rows:
        raise NotFound(ErrorCode.RUN_NOT_FOUND, "no such run")
    return run_from_rows(*_split(rows[0]))


def _active_from_row(row: Row[Any]) -> ActiveAttempt:
    handle: ProcessHandle | None = None
    invalid = False
    if row.handle is not None:
        try:
            handle = ProcessHandle.from_dict(json.loads(row.handle))
        except (ValueError, TypeError):
            invalid = True
    return ActiveAttempt(
        run_id=row.run_id,
        attempt_id=row.id,
        number=row.number,
        status=row.status,
        run_status=row.run_status,
        handle=handle,
        handle_invalid=invalid,
        deadline_at_ms=row.deadline_at_ms,
        cancel_reason=row.cancel_reason,
        log_artifact_id=row.log_artifact_id,
        created_at_ms=row.created_at_ms,
    )
