"""Run and attempt transitions: each method is one transaction of CAS updates plus events."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Literal

from sqlalchemy import (
    Connection,
    Engine,
    Row,
    Select,
    Table,
    and_,
    bindparam,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError

from app.domain.canonical import canonical_json
from app.domain.completion_rules import (
    LOCAL_PROCESS,
    AlreadyEnded,
    Refused,
    decide_completion,
    refuse_caller,
)
from app.domain.errors import (
    AdmissionRefused,
    Conflict,
    ErrorCode,
    InvalidTransition,
    NotFound,
    QueueFull,
    VersionConflict,
)
from app.domain.events import RUN_CANCEL_REQUESTED, RUN_RETRY_SCHEDULED, attempt_event, run_event
from app.domain.execution import CompletionOutcome
from app.domain.ids import now_ms, uuid7
from app.domain.model import LogInfo, ProcessHandle, Run
from app.domain.retry import retry_not_before_ms
from app.domain.states import (
    MAX_UNAVAILABLE_ATTEMPTS,
    TERMINAL_ATTEMPT,
    TERMINAL_RUN,
    AttemptStatus,
    RunStatus,
    ending_for,
    transition_attempt,
    transition_run,
    transition_run_to_retry,
)
from app.storage.definitions_repo import (
    archived_conflict,
    refuse_archived,
    retry_of_body,
    revision_row,
)
from app.storage.journal_repo import (
    consumed_move,
    mark_consumed_in,
    mark_spawned_in,
    spawned_move,
)
from app.storage.lease_repo import lease_current_in
from app.storage.one_statement import OneStatementRead
from app.storage.one_step import Counts, Writes, insert_run, run_writes, write_step
from app.storage.run_reads import (
    COUNT_ACTIVE,
    COUNT_HOST_ACTIVE,
    COUNT_QUEUED,
    COUNT_TASK_ACTIVE,
    HELD,
    run_from_rows,
)
from app.storage.tables import (
    RETRY_WAIT_WHERE,
    attempts,
    idempotency_keys,
    run_events,
    runs,
    task_archive,
    task_revisions,
)
from app.storage.uow import UnitOfWork

# Statements are built once: a statement built per call costs its construction and a
# cache-key walk on every execution, several times a prebuilt one, and every write
# transaction runs inside SQLite's single writer lock (figures: bench/README.md).
_RUN_BY_ID = select(runs).where(runs.c.id == bindparam("run_id"))
_ATTEMPT_BY_ID = select(attempts).where(attempts.c.id == bindparam("attempt_id"))
_ATTEMPT_BY_NUMBER = select(attempts).where(
    attempts.c.run_id == bindparam("run_id"), attempts.c.number == bindparam("number")
)
_HELD_BY_ID = select(HELD).where(runs.c.id == bindparam("run_id"))
# A run and an attempt read together: in READ COMMITTED each statement sees its own
# snapshot, so two SELECTs could straddle a concurrent commit (the attempt before
# record_running committed, the run after it) and a decision made on that torn pair raised
# InvalidTransition where a CAS retry would have found the truth. One statement is one
# snapshot, and one round trip.
_RUN_NAMES = tuple(c.name for c in runs.c)
_ATTEMPT_NAMES = tuple(c.name for c in attempts.c)
_RUN_COLUMNS = [c.label(f"r_{c.name}") for c in runs.c]
_ATTEMPT_COLUMNS = [c.label(f"a_{c.name}") for c in attempts.c]
#
# Both lock the two rows on PostgreSQL, the run's first (FOR UPDATE; SQLite's BEGIN
# IMMEDIATE already holds the one write lock): a transition that meets a concurrent one (T2
# and a fast job's completion, the classic pair) waits for it and then reads both rows as it
# committed them (READ COMMITTED re-fetches the newest version of every locked row), instead
# of reading the old version, failing its CAS after the wait and doing it all again. Every
# transition that reads a run with its attempt reads through one of these, so each locks the
# run before the attempt (a cancel reads the run alone, unlocked, and still updates the run
# first): one order, no deadlock. Inner joins, because a lock cannot take the missing side
# of an outer join; a run always has its latest attempt. A locked read can still come back
# empty: the transaction it waited for moved ``latest_attempt`` (a retry appended attempt
# n+1), the re-check of the join failed, and ``_load_pair`` reads once more.
_PAIR_BY_LATEST = (
    select(*_RUN_COLUMNS, *_ATTEMPT_COLUMNS)
    .select_from(
        runs.join(
            attempts,
            and_(attempts.c.run_id == runs.c.id, attempts.c.number == runs.c.latest_attempt),
        )
    )
    .where(runs.c.id == bindparam("run_id"))
    .with_for_update()
)
_ATTEMPT_AND_RUN = (
    select(*_RUN_COLUMNS, *_ATTEMPT_COLUMNS)
    .select_from(
        runs.join(
            attempts,
            and_(attempts.c.id == bindparam("attempt_id"), attempts.c.run_id == runs.c.id),
        )
    )
    .where(runs.c.id == bindparam("run_id"))
    .with_for_update()
)
_REVISION_BODY = select(task_revisions.c.body).where(
    task_revisions.c.task == bindparam("task"), task_revisions.c.revision == bindparam("revision")
)
# Attempts of a run that ended because no executor was there: they never ran, so a retry
# policy does not count them (docs/retries.md §2).
_UNAVAILABLE_COUNT = select(func.count()).where(
    attempts.c.run_id == bindparam("run_id"),
    attempts.c.error_code == ErrorCode.EXECUTOR_UNAVAILABLE.value,
)
_RECENT_CODES = (
    select(attempts.c.error_code)
    .where(
        attempts.c.run_id == bindparam("run_id"),
        attempts.c.number >= bindparam("first"),
        attempts.c.number < bindparam("number"),
    )
    .order_by(attempts.c.number.desc())
)
# ix_runs_retry_wait's predicate as the query's own terms (a bound status proves nothing).
_DUE = and_(text(RETRY_WAIT_WHERE), runs.c.not_before_ms <= bindparam("now"))
_ANY_DUE = select(runs.c.id).where(_DUE).limit(1)
_PROMOTE_DUE = (
    update(runs)
    .where(
        runs.c.id.in_(
            select(runs.c.id).where(_DUE).order_by(runs.c.not_before_ms).limit(bindparam("limit"))
        ),
        _DUE,
    )
    .values(not_before_ms=None)
)
_IDEMPOTENCY = select(idempotency_keys.c.request_digest, idempotency_keys.c.run_id).where(
    idempotency_keys.c.token_id == bindparam("token_id"),
    idempotency_keys.c.key == bindparam("key"),
)
# PostgreSQL transaction-scoped advisory locks that make a budget check and the write it
# guards one step across api processes. SQLite needs none: its write transactions begin
# IMMEDIATE (app/storage/engine.py), so they are serial already.
#
# Each is taken per schema: exclusive on (the oid of the schema that holds ``runs``, key),
# so that installations in two schemas of one database never wait for each other. Beside it the
# same key's database-wide lock, once taken exclusive alone, is taken shared: a process of a
# build before this (which takes only that one, exclusive) and one of this build still
# exclude each other while both serve during a rolling upgrade (docs/concurrency-budgets.md).
_ADMISSION_LOCK = 0x514C_0001  # T1 of any run
_QUEUE_LOCK = 0x514C_0002  # any insert of a queued run


# The schema whose ``runs`` the session's statements use (the first on its search_path),
# looked up when the statement runs: a plan-time ``'runs'::regclass`` would outlive a
# migration that recreates the table.
_SCHEMA_OID = (
    "coalesce((SELECT c.relnamespace::int FROM pg_class c WHERE c.relname = 'runs'"
    " AND c.relkind IN ('r', 'p') AND pg_table_is_visible(c.oid)), 0)"
)


def _advisory_lock_sql(key: int) -> str:
    return f"pg_advisory_xact_lock_shared({key}), pg_advisory_xact_lock({_SCHEMA_OID}, {key})"


_ADVISORY_LOCKS = {
    key: text(f"SELECT {_advisory_lock_sql(key)}") for key in (_ADMISSION_LOCK, _QUEUE_LOCK)
}
# T1's lock, and its commit not waited for: set_config(..., true) is SET LOCAL.
_ADMISSION_LOCK_UNSYNCED = text(
    f"SELECT {_advisory_lock_sql(_ADMISSION_LOCK)}, set_config('synchronous_commit', 'off', true)"
)
_INSERT_RUN = insert(runs)
_INSERT_ATTEMPT = insert(attempts)
_INSERT_EVENTS = insert(run_events)
_INSERT_IDEMPOTENCY = insert(idempotency_keys)
# SET columns come from the parameter keys; the WHERE binds are named apart from them.
_CAS_RUN = update(runs).where(
    runs.c.id == bindparam("where_id"), runs.c.version == bindparam("where_version")
)
_CAS_ATTEMPT = update(attempts).where(
    attempts.c.id == bindparam("where_id"), attempts.c.status == bindparam("where_status")
)


@dataclass(frozen=True, slots=True)
class _Event:
    type: str
    data: dict[str, Any]


class RunRepository:
    """Writes runs, attempts and events. Every public method commits one transaction or none."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        # Every drain asks it first (docs/retries.md §2): one statement, no transaction.
        self._any_due = OneStatementRead(engine, _ANY_DUE)

    # -- enqueue ---------------------------------------------------------------------------

    def enqueue_run(
        self,
        *,
        task: str,
        revision: int | None,
        priority: int | None,
        token_id: str | None = None,
        idempotency_key: str | None = None,
        request_digest: str | None = None,
        max_queued: int | None = None,
    ) -> tuple[Run, bool]:
        """Create a queued run with a claimed attempt 1; return ``(run, created)``.

        With ``max_queued``, QueueFull when that many runs are queued already; a replay of an
        idempotency key still returns its run (docs/concurrency-budgets.md §3).
        """

        def fields(conn: Connection) -> dict[str, Any]:
            return {"task": task, "revision": revision, "priority": priority}

        return self._enqueue_keyed(
            "enqueue", fields, token_id=token_id, idempotency_key=idempotency_key,
            request_digest=request_digest, max_queued=max_queued,
        )  # fmt: skip

    def rerun(
        self,
        *,
        run_id: str,
        token_id: str | None = None,
        idempotency_key: str | None = None,
        request_digest: str | None = None,
        max_queued: int | None = None,
    ) -> tuple[Run, bool]:
        """A new queued run of the same task revision and priority as ``run_id``, manual,
        ``rerun_of`` it (docs/retries.md §5); ``(run, created)``, idempotent by key as
        ``enqueue_run``. NotFound RUN_NOT_FOUND for an unknown run."""

        def fields(conn: Connection) -> dict[str, Any]:
            old = conn.execute(_RUN_BY_ID, {"run_id": run_id}).first()
            if old is None:
                raise NotFound(ErrorCode.RUN_NOT_FOUND, "no such run")
            return {
                "task": old.task, "revision": old.revision, "priority": old.priority,
                "rerun_of": old.id,
            }  # fmt: skip

        return self._enqueue_keyed(
            "rerun", fields, token_id=token_id, idempotency_key=idempotency_key,
            request_digest=request_digest, max_queued=max_queued,
        )  # fmt: skip

    def _enqueue_keyed(
        self,
        what: str,
        fields: Callable[[Connection], dict[str, Any]],
        *,
        token_id: str | None,
        idempotency_key: str | None,
        request_digest: str | None,
        max_queued: int | None,
    ) -> tuple[Run, bool]:
        """One enqueue transaction (``enqueue_in`` with ``fields(conn)``), idempotent by key:
        a replay returns the key's run; a concurrent request that inserted the same key
        first (IntegrityError) is read back on the next try."""
        for _ in range(3):
            try:
                with UnitOfWork(self._engine, grouped=True) as uow:
                    conn = uow.conn
                    replayed = _replay(conn, token_id, idempotency_key, request_digest)
                    if replayed is not None:
                        return replayed, False
                    at = now_ms()
                    # QueueFull past the cap: the insert is rolled back with the transaction.
                    run_values, attempt_values = enqueue_in(
                        conn, at=at, max_queued=max_queued, **fields(conn)
                    )
                    _remember(conn, token_id, idempotency_key, request_digest, run_values["id"], at)
                    uow.commit()
                # What was just inserted, without reading it back inside the writer lock.
                run_row, attempt_row = _row_of(runs, run_values), _row_of(attempts, attempt_values)
                return run_from_rows(run_row, attempt_row), True
            except IntegrityError:
                if idempotency_key is None:
                    raise
        raise VersionConflict(what)

    def promote_due_retries(self, *, limit: int) -> int:
        """Clear the waiting mark of up to ``limit`` queued runs whose retry instant passed,
        so the dispatch walk (ix_runs_ready_page) finds them; how many. A read first: with
        none due no write transaction is opened (docs/retries.md §2). Not a transition: the
        run stays ``queued`` at the same version, and T1 still checks the attempt's own
        instant."""
        params = {"now": now_ms(), "limit": limit}
        if not self._any_due.rows(params):
            return 0
        with UnitOfWork(self._engine) as uow:
            count = uow.conn.execute(_PROMOTE_DUE, params).rowcount
            uow.commit()
        return int(count or 0)

    def queued_count(self) -> int:
        """How many runs are queued now (a read; ``queue_has_room`` is the atomic check)."""
        with UnitOfWork(self._engine, write=False) as uow:
            return int(uow.conn.execute(COUNT_QUEUED).scalar_one())

    # -- coordinator transitions (docs/design.md §3.7, §3.8) --------------------------------

    def begin_dispatch(
        self,
        *,
        run_id: str,
        attempt_id: str,
        expected_version: int | None,
        token_digest: str,
        deadline_at_ms: int | None,
        log_artifact_id: str,
        max_running: int | None = None,
        max_concurrent: int | None = None,
        worker_instance_id: str | None = None,
        lease_epoch: int | None = None,
    ) -> Run:
        """T1: run queued→dispatching and attempt claimed→starting with the callback digest.

        The concurrency budgets are checked in this same transaction, after a lock that
        every T1 takes (docs/concurrency-budgets.md §2): AdmissionRefused("global") when
        ``max_running`` runs are dispatching or running (on PostgreSQL with a
        ``worker_instance_id``: that many attempts of this host, docs/several-hosts.md §3),
        AdmissionRefused("task") when ``max_concurrent`` runs of this run's task are.
        AdmissionRefused("held") when the run waits behind an older run of its schedule that
        has not ended (docs/schedules.md §5).

        ``worker_instance_id`` and ``lease_epoch``: the worker this start launches through
        (docs/several-hosts.md §2), recorded on the attempt.
        """
        with UnitOfWork(self._engine, grouped=True, synced=False) as uow:
            run_row, attempt_row = _load_pair(uow.conn, run_id, attempt_id)
            if expected_version is not None and run_row.version != expected_version:
                raise VersionConflict(run_id)
            if run_row.cancel_reason is not None:
                raise InvalidTransition(
                    "run", run_row.status, RunStatus.DISPATCHING,
                    reason="the run has a cancel intent",
                )  # fmt: skip
            if (
                attempt_row.executor != LOCAL_PROCESS
                or attempt_row.callback_sequence != 0
                or attempt_row.callback_token_digest is not None
            ):
                raise InvalidTransition(
                    "attempt", attempt_row.status, AttemptStatus.STARTING,
                    reason="the attempt was already armed",
                )  # fmt: skip
            if (
                run_row.hold_from_slot_ms is not None
                and uow.conn.execute(_HELD_BY_ID, {"run_id": run_id}).scalar_one()
            ):
                raise AdmissionRefused("held")
            at = now_ms()
            if attempt_row.not_before_ms is not None and at < attempt_row.not_before_ms:
                # docs/retries.md §2: never before its instant, whatever listed it.
                raise InvalidTransition(
                    "attempt", attempt_row.status, AttemptStatus.STARTING,
                    reason="the attempt waits for its retry time",
                )  # fmt: skip
            host: dict[str, Any] = {}
            if worker_instance_id is not None:
                host = {"worker_instance_id": worker_instance_id, "lease_epoch": lease_epoch}
            budgets = _budget_counts(
                uow.conn, run_row.task, max_running, max_concurrent, worker_instance_id
            )
            in_step = bool(budgets) and uow.conn.dialect.name == "postgresql"
            if in_step:
                # The lock before the step, and the budget counts in the step's own statement
                # (one round trip less): its snapshot comes after the lock, and it leaves out
                # this start. The lock is held for that statement and the commit only.
                uow.conn.execute(_ADMISSION_LOCK_UNSYNCED)
            written = _step(
                uow.conn,
                run_row,
                attempt_row,
                at,
                run_to=RunStatus.DISPATCHING,
                attempt_to=AttemptStatus.STARTING,
                attempt_values={
                    "callback_token_digest": token_digest,
                    "deadline_at_ms": deadline_at_ms,
                    "log_artifact_id": log_artifact_id,
                    **host,
                },
                order="run_first",
                counts=budgets if in_step else None,
            )
            if in_step:
                _admit(written.counts, max_running, max_concurrent, this_start=1)
            elif budgets:
                # SQLite: BEGIN IMMEDIATE holds the writer lock already, and counts taken
                # after T1's writes include this start.
                counted = {
                    name: int(uow.conn.execute(count, params).scalar_one())
                    for name, (count, params) in budgets.items()
                }
                _admit(counted, max_running, max_concurrent, this_start=0)
            uow.commit()
        return written.run()

    def record_running(
        self, *, run_id: str, attempt_id: str, handle: ProcessHandle, started_at_ms: int
    ) -> Run:
        """T2: attempt starting→running with its durable handle, run dispatching→running."""
        with UnitOfWork(self._engine, grouped=True) as uow:
            pair = _load_pair(uow.conn, run_id, attempt_id)
            written = _to_running(uow.conn, *pair, started_at_ms, handle)
            uow.commit()
        return written.run()

    def record_spawned_running(
        self, *, run_id: str, attempt_id: str, handle: ProcessHandle, started_at_ms: int
    ) -> Literal["running", "spawned", "not_reserved"]:
        """The worker's spawn record and T2 in one transaction (docs/design.md §3.7).

        ``running``: the journal entry is ``spawned`` with the handle and the attempt and run
        are ``running``, committed together. ``spawned``: T2 was refused (the pair is not
        ``dispatching``/``starting`` any more, or not found): only the journal entry was
        written, and the caller's T2 meets the same refusal and compensates as it always did.
        ``not_reserved``: the entry was not ``reserved``; nothing was written.
        """
        with UnitOfWork(self._engine, grouped=True) as uow:
            conn = uow.conn
            # The pair first (on PostgreSQL its read locks the run and attempt rows), then the
            # journal row: the order of the completion, which consumes the entry after them.
            try:
                pair: tuple[Any, Any] | None = _load_pair(conn, run_id, attempt_id)
            except NotFound:
                pair = None
            written: _Written | None = None
            lost_cas = False
            if pair is not None:
                try:
                    # The journal's move rides in T2's statement (one round trip less).
                    # Refusals are raised before any write (the transition rules).
                    written = _to_running(
                        conn, *pair, started_at_ms, handle,
                        writes={"journal": spawned_move(attempt_id, handle)},
                    )  # fmt: skip
                except InvalidTransition:
                    pass  # T2 refused: the journal's move stands alone, below
                except VersionConflict:
                    lost_cas = True  # after the read (never under the locks): start again
            if written is not None:
                if written.counts["journal"] != 1:
                    return "not_reserved"  # rolled back: no T2 without its journal entry
                uow.commit()
                return "running"
            if not lost_cas:
                if not mark_spawned_in(conn, attempt_id, handle):
                    return "not_reserved"
                uow.commit()
                return "spawned"
        with UnitOfWork(self._engine, grouped=True) as uow:
            moved = mark_spawned_in(uow.conn, attempt_id, handle)
            uow.commit()
        return "spawned" if moved else "not_reserved"

    def fail_attempt(
        self,
        *,
        run_id: str,
        attempt_id: str,
        error_code: ErrorCode,
        lost: bool = False,
        expected_version: int | None = None,
        detail: Mapping[str, str] | None = None,
    ) -> Run:
        """End a not-yet-finished attempt and its run as ``failed`` (or ``lost``) with a code.

        ``expected_version`` pins the run version the caller saw (the materializer fails only
        the exact queued candidate it read, never a run another process has since dispatched).
        ``detail`` joins the attempt's ending event (content-free codes; it never replaces
        ``error_code``).
        """
        with UnitOfWork(self._engine) as uow:
            run_row, attempt_row = _load_pair(uow.conn, run_id, attempt_id)
            if expected_version is not None and run_row.version != expected_version:
                raise VersionConflict(run_id)
            at = now_ms()
            written = end_attempt_in(
                uow.conn,
                run_row,
                attempt_row,
                at,
                ending=AttemptStatus.LOST if lost else AttemptStatus.FAILED,
                finished_at_ms=at,
                attempt_values={"error_code": error_code.value, "finished_at_ms": at},
                attempt_data={**(detail or {}), "error_code": error_code.value},
                error_code=error_code.value,
            )
            uow.commit()
        return written.run()

    def requeue_unspawned(self, *, run_id: str, attempt_id: str) -> Run:
        """A start that provably spawned nothing: the attempt ends failed EXECUTOR_UNAVAILABLE
        and the run goes back to ``queued`` with a fresh ``claimed`` attempt, all in one
        transaction (events ``attempt.failed``, ``run.queued``, ``attempt.claimed``).

        Instead of a fresh attempt, a committed cancel intent ends the run (cancelled or
        timed_out: nothing ran, the user's ending stands), and the MAX_UNAVAILABLE_ATTEMPTS-th
        unavailable start in a row ends it failed EXECUTOR_UNAVAILABLE.

        Raises: NotFound (not the run's latest attempt), InvalidTransition (the start is no
        longer dispatching/starting), VersionConflict (a concurrent change won the CAS).
        """
        code = ErrorCode.EXECUTOR_UNAVAILABLE.value
        with UnitOfWork(self._engine) as uow:
            conn = uow.conn
            run_row, attempt_row = _load_pair(conn, run_id, attempt_id)
            if attempt_row.status != AttemptStatus.STARTING:
                raise InvalidTransition("attempt", attempt_row.status, AttemptStatus.FAILED)
            transition_run(RunStatus(run_row.status), RunStatus.QUEUED)
            at = now_ms()
            if run_row.cancel_reason is not None or _unavailable_in_a_row(conn, attempt_row):
                ending, values = AttemptStatus.FAILED, {"error_code": code}
                if run_row.cancel_reason is not None:
                    ending = ending_for(
                        exit_code=None, signal=None, cancel_reason=run_row.cancel_reason
                    )
                    values = {}
                # Through the retry rule like every ending (a timeout's intent may be
                # retried; EXECUTOR_UNAVAILABLE never is: app/domain/retry.py).
                written = end_attempt_in(
                    conn, run_row, attempt_row, at, ending=ending, finished_at_ms=at,
                    attempt_values={**values, "finished_at_ms": at}, attempt_data=values,
                    error_code=values.get("error_code"),
                )  # fmt: skip
                uow.commit()
                return written.run()
            number = attempt_row.number + 1
            fresh = {
                "id": uuid7(at),
                "run_id": run_id,
                "number": number,
                "status": AttemptStatus.CLAIMED.value,
                "executor": attempt_row.executor,
                "created_at_ms": at,
                "callback_sequence": 0,
            }
            run_values = {"status": RunStatus.QUEUED.value, "latest_attempt": number}
            # The run row first, as in _step (PostgreSQL lock order against a concurrent T1).
            _cas_run(conn, run_row, 3, run_values)
            _update_attempt(
                conn, attempt_row, AttemptStatus.FAILED, {"error_code": code, "finished_at_ms": at}
            )
            conn.execute(_INSERT_ATTEMPT, fresh)
            _append_events(
                conn, run_id, run_row.version + 1, at,
                [
                    _Event(attempt_event(AttemptStatus.FAILED),
                           {"attempt": attempt_row.number, "error_code": code}),
                    _Event(run_event(RunStatus.QUEUED), {"attempt": number}),
                    _Event(attempt_event(AttemptStatus.CLAIMED), {"attempt": number}),
                ],
            )  # fmt: skip
            uow.commit()
        run_values["version"] = run_row.version + 3
        return run_from_rows(_row_of(runs, run_values, run_row), _row_of(attempts, fresh))

    # -- completion (docs/design.md §3.12) ----------------------------------------------------

    def complete_attempt(
        self,
        *,
        run_id: str,
        attempt_id: str,
        token: str,
        callback_sequence: int,
        exit_code: int,
        signal: int | None,
        finished_at_ms: int,
        log: LogInfo | None = None,
        started_at_ms: int | None = None,
        consume_receipt: bool = False,
        leftovers_stopped: int | None = None,
        fence: tuple[str, int] | None = None,
    ) -> CompletionOutcome:
        """The one transaction that turns a process ending into a terminal state, once.

        ``fence`` (slot, epoch): the completing worker's lease. When that lease is no longer
        at this epoch, or released, or expired, nothing is written and the answer is
        ``fenced`` (docs/several-hosts.md §4: a stale worker never records an ending).

        With ``consume_receipt``, an ``applied`` or ``already_terminal`` answer also moves
        the attempt's receipt journal entry to ``consumed`` in the same transaction: there is
        no moment where the ending is recorded and the journal still says pending (and one
        commit less inside SQLite's writer lock per run).

        Whether the ending is accepted (token, sequence, latest attempt, the starting →
        running catch-up, which ending, which times) is decided by app/domain/completion_rules.py
        from the rows read here; this method reads them, asks, and writes the decision in the
        same transaction.
        """
        with UnitOfWork(self._engine, grouped=True) as uow:
            conn = uow.conn
            if fence is not None and not lease_current_in(conn, slot=fence[0], epoch=fence[1]):
                return CompletionOutcome("fenced", reason=ErrorCode.LEASE_EPOCH_SUPERSEDED.value)
            pair = conn.execute(_ATTEMPT_AND_RUN, {"attempt_id": attempt_id, "run_id": run_id})
            found = pair.first()
            run_row, attempt_row = (None, None) if found is None else _split_pair(found)
            refused = refuse_caller(attempt_row, run_id=run_id, token=token)
            if refused is not None:
                return CompletionOutcome("rejected", reason=refused.reason)
            assert attempt_row is not None  # refuse_caller refuses a missing attempt
            assert run_row is not None  # the attempt's own run (refuse_caller checked the id)
            decision = decide_completion(
                attempt_row,
                run_row,
                callback_sequence=callback_sequence,
                exit_code=exit_code,
                signal=signal,
                finished_at_ms=finished_at_ms,
                started_at_ms=started_at_ms,
            )
            if isinstance(decision, Refused):
                return CompletionOutcome("rejected", reason=decision.reason)
            if isinstance(decision, AlreadyEnded):
                if consume_receipt and mark_consumed_in(conn, attempt_id):
                    uow.commit()
                return CompletionOutcome("already_terminal", run_status=decision.run_status)
            began = decision.catch_up_started_at_ms
            if began is not None:
                run_row, attempt_row = _to_running(conn, run_row, attempt_row, began).rows()
            ending = decision.ending
            values: dict[str, Any] = {
                "exit_code": decision.exit_code,
                "signal": decision.signal,
                "callback_sequence": callback_sequence,
                "finished_at_ms": decision.finished_at_ms,
            }
            if log is not None:
                values |= {
                    "log_bytes": log.bytes,
                    "log_truncated": log.truncated,
                    "log_dropped_bytes": log.dropped_bytes,
                    "log_truncation_reason": log.reason,
                    "log_dropped_at": log.dropped_at,
                }
            data = {"exit_code": decision.exit_code, "signal": decision.signal}
            if leftovers_stopped is not None:  # a count only (docs/leftovers.md)
                data["leftovers_stopped"] = leftovers_stopped
            written = end_attempt_in(
                conn,
                run_row,
                attempt_row,
                now_ms(),
                ending=ending,
                finished_at_ms=decision.finished_at_ms,
                attempt_values=values,
                attempt_data=data,
                error_code=None,
                # The journal's consumed in the ending's own statement (one round trip less).
                writes={"journal": consumed_move(attempt_id)} if consume_receipt else None,
            )
            uow.commit()
            # ``queued`` when a retry follows: the run's one terminal event is still to come.
            status = written.run_values["status"]
            return CompletionOutcome("applied", run_status=status, task=run_row.task)

    # -- intents -----------------------------------------------------------------------------

    def request_cancel(
        self,
        *,
        run_id: str,
        reason: Literal["user", "timeout", "service_stop"],
        attempt_id: str | None = None,
        service_stop: bool = False,
    ) -> Run:
        """Record a cancel intent once; a queued run is cancelled at once.

        ``attempt_id`` (a timeout): the attempt whose deadline passed. InvalidTransition when
        it is no longer the run's latest attempt or has ended: a retry that followed it has
        its own deadline (docs/retries.md §2), so a stale read never times it out.
        ``service_stop``: ``serve --stop-jobs-on-exit`` asks, under a reason older builds read
        (``user``, app/supervisor/stop_jobs.py); its ``run.cancel_requested`` event says so.
        """
        with UnitOfWork(self._engine) as uow:
            conn = uow.conn
            run_row = conn.execute(_RUN_BY_ID, {"run_id": run_id}).first()
            if run_row is None:
                raise NotFound(ErrorCode.RUN_NOT_FOUND, "no such run")
            if run_row.status in TERMINAL_RUN:
                raise Conflict(ErrorCode.RUN_TERMINAL, f"the run already ended ({run_row.status})")
            attempt_row = _latest_attempt(conn, run_row)
            if attempt_id is not None and (
                attempt_row.id != attempt_id or attempt_row.status in TERMINAL_ATTEMPT
            ):
                raise InvalidTransition(
                    "attempt", attempt_row.status, AttemptStatus.TIMED_OUT,
                    reason="the attempt whose deadline passed already ended",
                )  # fmt: skip
            if run_row.cancel_reason is not None:
                return run_from_rows(run_row, attempt_row)
            written = cancel_in(
                conn, run_row, reason, now_ms(), attempt_row, service_stop=service_stop
            )
            uow.commit()
        return written.run()


def lose_in(conn: Connection, *, run_id: str, attempt_id: str, code: ErrorCode, at: int) -> None:
    """End an active attempt ``lost`` with ``code`` inside ``conn``'s transaction, through
    ``end_attempt_in`` like every ending (a ``lost`` whose process may still live, such as
    WORKER_LEASE_EXPIRED, is never retried: app/domain/retry.py).

    Raises: NotFound (not the run's latest attempt), InvalidTransition, VersionConflict.
    """
    run_row, attempt_row = _load_pair(conn, run_id, attempt_id)
    end_attempt_in(
        conn, run_row, attempt_row, at, ending=AttemptStatus.LOST, finished_at_ms=at,
        attempt_values={"error_code": code.value, "finished_at_ms": at},
        attempt_data={"error_code": code.value},
        error_code=code.value,
    )  # fmt: skip


# -- budgets (docs/concurrency-budgets.md) --------------------------------------------------


def queue_has_room(conn: Connection, max_queued: int) -> bool:
    """Inside a write transaction that is about to insert a queued run: True when fewer
    than ``max_queued`` runs are queued.

    Exact across processes: on PostgreSQL it first takes the queue lock, held to the end
    of the caller's transaction; on SQLite the write transaction is serial already. Every
    writer of queued runs (``POST /api/v1/runs``, a schedule's slot) calls it in the
    transaction that inserts.
    """
    _lock(conn, _QUEUE_LOCK)
    return int(conn.execute(COUNT_QUEUED).scalar_one()) < max_queued


def _lock(conn: Connection, key: int) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(_ADVISORY_LOCKS[key])


def _budget_counts(
    conn: Connection,
    task: str,
    max_running: int | None,
    max_concurrent: int | None,
    worker_instance_id: str | None,
) -> Counts:
    """What T1's budgets count, each statement with its parameters, by name (a name stands
    for one statement: it keys the statement's cache in one_step.py). QL_MAX_RUNNING bounds,
    on PostgreSQL with several hosts, this host's active attempts (docs/several-hosts.md
    §3), otherwise the database's active runs; ``max_concurrent`` the task's active runs."""
    counts: dict[str, tuple[Select[Any], dict[str, Any]]] = {}
    if max_running is not None:
        if worker_instance_id is not None and conn.dialect.name == "postgresql":
            counts["host_active"] = (COUNT_HOST_ACTIVE, {"count_instance": worker_instance_id})
        else:
            counts["active"] = (COUNT_ACTIVE, {})
    if max_concurrent is not None:
        counts["task_active"] = (COUNT_TASK_ACTIVE, {"count_task": task})
    return counts


def _admit(
    counted: dict[str, int], max_running: int | None, max_concurrent: int | None, *, this_start: int
) -> None:
    """AdmissionRefused unless each budget holds with this start: ``this_start`` is 1 when
    the counts did not see it (taken in T1's own statement), 0 when they did."""
    if max_running is not None:
        active = counted["host_active"] if "host_active" in counted else counted["active"]
        if active + this_start > max_running:
            raise AdmissionRefused("global")
    if max_concurrent is not None and counted["task_active"] + this_start > max_concurrent:
        raise AdmissionRefused("task")


# -- helpers -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScheduleTrigger:
    """The schedule slot a run is started for (docs/schedules.md)."""

    schedule_id: str
    schedule_name: str
    slot_ms: int


_NO_NEW_RUN = "it starts no new run"
_COUNT_ARCHIVED = (
    select(func.count())
    .select_from(task_archive)
    .where(
        task_archive.c.task == bindparam("archived_task"),
        task_archive.c.archived_at_ms.is_not(None),
    )
)


def enqueue_in(
    conn: Connection,
    *,
    task: str,
    revision: int | None,
    priority: int | None,
    at: int,
    trigger: ScheduleTrigger | None = None,
    hold_from_slot_ms: int | None = None,
    rerun_of: str | None = None,
    max_queued: int | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Insert a queued run, its claimed attempt 1 and ``run.queued`` inside ``conn``'s
    transaction; the run's and attempt's inserted values.

    The one enqueue path: ``POST /api/v1/runs`` and a schedule's fire both come here, so a
    scheduled run is the same run as a manual one but for its trigger columns (and, for a
    schedule's queue_one/replace run, ``hold_from_slot_ms``: docs/schedules.md §5).

    With ``max_queued``: QueueFull, the caller's transaction to be rolled back, unless this
    run is within that many queued runs (docs/concurrency-budgets.md §3): on PostgreSQL the
    queue lock comes right before the insert, whose one statement also counts the runs
    queued before it; on SQLite a count follows the insert.
    """
    # On PostgreSQL the read takes the task's lock shared: an archive (which takes it
    # alone) commits before it or waits for this enqueue's commit (docs/api.md §4).
    rev = revision_row(conn, task, revision, share_lock=True)
    refuse_archived(rev, _NO_NEW_RUN)  # TASK_ARCHIVED (docs/api.md §4)
    run_id = uuid7(at)
    run_values: dict[str, Any] = {
        "id": run_id,
        "task": task,
        "revision": rev.revision,
        "status": RunStatus.QUEUED.value,
        "priority": rev.priority if priority is None else priority,
        "version": 1,
        "latest_attempt": 1,
        "created_at_ms": at,
        "trigger_kind": "manual" if trigger is None else "schedule",
        "schedule_id": None if trigger is None else trigger.schedule_id,
        "schedule_name": None if trigger is None else trigger.schedule_name,
        "slot_ms": None if trigger is None else trigger.slot_ms,
        "hold_from_slot_ms": hold_from_slot_ms,
        "rerun_of": rerun_of,
    }
    attempt_values = {
        "id": uuid7(at),
        "run_id": run_id,
        "number": 1,
        "status": AttemptStatus.CLAIMED.value,
        "executor": rev.executor,
        "created_at_ms": at,
        "callback_sequence": 0,
    }
    queued = [_Event(run_event(RunStatus.QUEUED), {"attempt": 1})]
    if conn.dialect.name == "postgresql":
        # One round trip instead of three (app/storage/one_step.py), and with a cap the
        # count in it: the lock first, held from here to the commit, so the statement's
        # snapshot sees every run queued before it (the count leaves out its own insert).
        # The archive is read again in the insert: the read above may have waited for the
        # task's lock while an archive committed, and its snapshot is older than that
        # commit; this statement's is not.
        (row,) = _event_rows(run_id, 1, at, queued)
        counts: Counts = {"archived": (_COUNT_ARCHIVED, {"archived_task": task})}
        if max_queued is not None:
            _lock(conn, _QUEUE_LOCK)
            counts = {**counts, "queued": (COUNT_QUEUED, {})}
        counted = insert_run(
            conn, run_values=run_values, attempt_values=attempt_values, event_row=row,
            counts=counts,
        )  # fmt: skip
        if counted["archived"]:  # the caller's transaction is rolled back, as for QueueFull
            raise archived_conflict(task, _NO_NEW_RUN)
        if max_queued is not None and counted["queued"] + 1 > max_queued:
            raise QueueFull(max_queued)
    else:
        conn.execute(_INSERT_RUN, run_values)
        conn.execute(_INSERT_ATTEMPT, attempt_values)
        _append_events(conn, run_id, 1, at, queued)
        # BEGIN IMMEDIATE holds the writer lock already; the count includes this run.
        if max_queued is not None and int(conn.execute(COUNT_QUEUED).scalar_one()) > max_queued:
            raise QueueFull(max_queued)
    return run_values, attempt_values


def cancel_in(
    conn: Connection,
    run_row: Row[Any],
    reason: str,
    at: int,
    attempt_row: Row[Any] | None = None,
    *,
    service_stop: bool = False,
) -> _Written:
    """Record a cancel intent on a non-terminal run without one, inside ``conn``'s
    transaction; a queued run ends at once (attempt and run cancelled, three events).
    ``service_stop`` adds ``"service_stop": true`` to the ``run.cancel_requested`` event.

    The one cancel path: a user's cancel, a timeout, a deleted schedule's queued runs and a
    ``replace`` overlap all record it here.
    """
    if attempt_row is None:
        attempt_row = _latest_attempt(conn, run_row)
    intent: dict[str, Any] = {"cancel_reason": reason, "cancel_requested_at_ms": at}
    requested: dict[str, Any] = {"reason": reason}
    if service_stop:
        requested["service_stop"] = True
    events = [_Event(RUN_CANCEL_REQUESTED, requested)]
    ended = None
    attempt_values: dict[str, Any] = {}
    if run_row.status == RunStatus.QUEUED:
        ended = AttemptStatus.TIMED_OUT if reason == "timeout" else AttemptStatus.CANCELLED
        transition_attempt(AttemptStatus(attempt_row.status), ended)
        transition_run(RunStatus.QUEUED, RunStatus(ended.value))
        events += [
            _Event(attempt_event(ended), {"attempt": attempt_row.number}),
            _Event(run_event(RunStatus(ended.value)), {}),
        ]
        intent |= {"status": ended.value, "finished_at_ms": at}
        attempt_values = {"status": ended.value, "finished_at_ms": at}
    # The run row first, as in _step: PostgreSQL row locks taken in the other order
    # deadlock against a concurrent T1 (one side aborted with a database error).
    _cas_run(conn, run_row, len(events), intent)
    if ended is not None:
        _update_attempt(conn, attempt_row, ended, {"finished_at_ms": at})
    _append_events(conn, run_row.id, run_row.version + 1, at, events)
    run_values = {"version": run_row.version + len(events), **intent}
    return _Written(run_row, attempt_row, run_values, attempt_values)


def end_attempt_in(
    conn: Connection,
    run_row: Row[Any],
    attempt_row: Row[Any],
    at: int,
    *,
    ending: AttemptStatus,
    finished_at_ms: int,
    attempt_values: dict[str, Any],
    attempt_data: dict[str, Any],
    error_code: str | None,
    writes: Writes | None = None,
) -> _Written:
    """Record an attempt's ending inside ``conn``'s transaction: the one place every path
    that ends an attempt (completion, timeout, start failure, recovery) comes through.
    ``writes`` as in ``_step`` (their row counts in ``_Written.counts``).

    When the revision's retry policy asks for another attempt (app/domain/retry.py), the
    same transaction appends attempt n+1 ``claimed`` with its ``not_before_ms`` (jitter drawn
    here, once, and stored), moves the run back to ``queued`` and clears the ended
    attempt's own timeout intent (events ``attempt.<ending>``, ``run.retry_scheduled``,
    ``attempt.claimed``). Otherwise run and attempt end together (docs/retries.md §2).
    """
    not_before = _retry_at(conn, run_row, attempt_row, ending, error_code, at)
    if not_before is None:
        return _step(
            conn,
            run_row,
            attempt_row,
            at,
            run_to=RunStatus(ending.value),
            attempt_to=ending,
            attempt_values=attempt_values,
            run_values={"finished_at_ms": finished_at_ms},
            attempt_data=attempt_data,
            order="attempt_first",
            writes=writes,
        )
    transition_attempt(AttemptStatus(attempt_row.status), ending)
    transition_run_to_retry(RunStatus(run_row.status))
    number = attempt_row.number + 1
    fresh = {
        "id": uuid7(at),
        "run_id": run_row.id,
        "number": number,
        "status": AttemptStatus.CLAIMED.value,
        "executor": attempt_row.executor,
        "created_at_ms": at,
        "callback_sequence": 0,
        "not_before_ms": not_before,
    }
    run_values: dict[str, Any] = {
        "status": RunStatus.QUEUED.value,
        "latest_attempt": number,
        "cancel_reason": None,
        "cancel_requested_at_ms": None,
        "not_before_ms": not_before,  # off the dispatch walk until promote_due_retries
    }
    # The run row first, as in _step (PostgreSQL lock order against a concurrent T1).
    _cas_run(conn, run_row, 3, run_values)
    _update_attempt(conn, attempt_row, ending, attempt_values)
    conn.execute(_INSERT_ATTEMPT, fresh)
    _append_events(
        conn, run_row.id, run_row.version + 1, at,
        [
            _Event(attempt_event(ending), {"attempt": attempt_row.number, **attempt_data}),
            _Event(RUN_RETRY_SCHEDULED, {"attempt": number, "not_before_ms": not_before}),
            _Event(attempt_event(AttemptStatus.CLAIMED), {"attempt": number}),
        ],
    )  # fmt: skip
    run_values["version"] = run_row.version + 3
    return _Written(run_row, None, run_values, fresh, run_writes(conn, writes or {}))


def _retry_at(
    conn: Connection,
    run_row: Row[Any],
    attempt_row: Row[Any],
    ending: AttemptStatus,
    error_code: str | None,
    at: int,
) -> int | None:
    if ending not in (AttemptStatus.FAILED, AttemptStatus.TIMED_OUT, AttemptStatus.LOST):
        return None  # the common case (succeeded, cancelled) reads nothing more
    body = conn.execute(
        _REVISION_BODY, {"task": run_row.task, "revision": run_row.revision}
    ).scalar()
    policy = retry_of_body(json.loads(body)) if body is not None else None
    if policy is None:
        return None
    tries = attempt_row.number
    if tries > 1:
        tries -= int(conn.execute(_UNAVAILABLE_COUNT, {"run_id": run_row.id}).scalar_one())
    return retry_not_before_ms(
        policy,
        attempt=tries,
        ending=ending.value,
        error_code=error_code,
        cancel_reason=run_row.cancel_reason,
        ended_at_ms=at,
        draw=random.random(),  # noqa: S311 (jitter, not a secret): drawn once, stored
    )


def _unavailable_in_a_row(conn: Connection, attempt_row: Row[Any]) -> bool:
    """True when this unavailable start is the MAX_UNAVAILABLE_ATTEMPTS-th in a row: the
    attempts before it were unavailable too (retries make attempt numbers no count of it)."""
    number = attempt_row.number
    if number < MAX_UNAVAILABLE_ATTEMPTS:
        return False
    codes = conn.execute(
        _RECENT_CODES,
        {"run_id": attempt_row.run_id, "first": number - MAX_UNAVAILABLE_ATTEMPTS + 1,
         "number": number},
    ).scalars().all()  # fmt: skip
    return all(code == ErrorCode.EXECUTOR_UNAVAILABLE.value for code in codes)


def _replay(
    conn: Connection, token_id: str | None, key: str | None, request_digest: str | None
) -> Run | None:
    """The run an earlier request with this token's idempotency key made, if any; Conflict
    IDEMPOTENCY_KEY_REUSED when that request was another one (docs/design.md §3.2)."""
    if key is None:
        return None
    previous = conn.execute(_IDEMPOTENCY, {"token_id": token_id or "", "key": key}).first()
    if previous is None:
        return None
    if previous.request_digest != request_digest:
        raise Conflict(
            ErrorCode.IDEMPOTENCY_KEY_REUSED,
            # A rerun has no body: its request is the run it names.
            "this Idempotency-Key was used for another request (a start with another body, "
            "or a rerun of another run, or the other of the two)",
        )
    return _load_run(conn, previous.run_id)


def _remember(
    conn: Connection,
    token_id: str | None,
    key: str | None,
    request_digest: str | None,
    run_id: str,
    at: int,
) -> None:
    if key is not None:
        conn.execute(
            _INSERT_IDEMPOTENCY,
            {
                "token_id": token_id or "",
                "key": key,
                "request_digest": request_digest or "",
                "run_id": run_id,
                "created_at_ms": at,
            },
        )


def _load_run(conn: Connection, run_id: str) -> Run:
    run_row = conn.execute(_RUN_BY_ID, {"run_id": run_id}).first()
    if run_row is None:
        raise NotFound(ErrorCode.RUN_NOT_FOUND, "no such run")
    return run_from_rows(run_row, _latest_attempt(conn, run_row))


def _latest_attempt(conn: Connection, run_row: Row[Any]) -> Row[Any]:
    return conn.execute(
        _ATTEMPT_BY_NUMBER, {"run_id": run_row.id, "number": run_row.latest_attempt}
    ).one()


def _to_running(
    conn: Connection,
    run_row: Any,
    attempt_row: Any,
    started_at_ms: int,
    handle: ProcessHandle | None = None,
    writes: Writes | None = None,
) -> _Written:
    """Attempt and run ``running`` from ``started_at_ms``: T2 with the durable ``handle``, or
    a completion's catch-up (no handle). Refusals raise before any write (``writes`` as in
    ``_step``)."""
    attempt_values: dict[str, Any] = {"started_at_ms": started_at_ms}
    if handle is not None:
        attempt_values["handle"] = json.dumps(handle.to_dict(), sort_keys=True)
    return _step(
        conn,
        run_row,
        attempt_row,
        now_ms(),
        run_to=RunStatus.RUNNING,
        attempt_to=AttemptStatus.RUNNING,
        attempt_values=attempt_values,
        # A retry's start keeps the run's first one (docs/retries.md §2).
        run_values={"started_at_ms": run_row.started_at_ms or started_at_ms},
        order="attempt_first",
        writes=writes,
    )


def _load_pair(conn: Connection, run_id: str, attempt_id: str) -> tuple[Any, Any]:
    """The run and its latest attempt, one snapshot; NotFound unless that is ``attempt_id``."""
    row = conn.execute(_PAIR_BY_LATEST, {"run_id": run_id}).first()
    if row is None:
        # Empty after waiting on the lock when the winner moved latest_attempt: a fresh
        # statement sees the run as it is now (the lock is held since).
        row = conn.execute(_PAIR_BY_LATEST, {"run_id": run_id}).first()
    if row is None:
        raise NotFound(ErrorCode.RUN_NOT_FOUND, "no such run")
    run_row, attempt_row = _split_pair(row)
    if attempt_row is None or attempt_row.id != attempt_id:
        raise NotFound(ErrorCode.ATTEMPT_NOT_FOUND, "the attempt is not the run's latest")
    return run_row, attempt_row


def _split_pair(row: Row[Any]) -> tuple[Any, Any]:
    """(run, attempt) of a pair statement's row, each None when its side is missing."""
    values = tuple(row)
    cut = len(_RUN_COLUMNS)
    run_row = SimpleNamespace(**dict(zip(_RUN_NAMES, values[:cut], strict=True)))
    attempt_row = SimpleNamespace(**dict(zip(_ATTEMPT_NAMES, values[cut:], strict=True)))
    return (
        None if run_row.id is None else run_row,
        None if attempt_row.id is None else attempt_row,
    )


def _cas_run(conn: Connection, run_row: Row[Any], steps: int, values: dict[str, Any]) -> None:
    result = conn.execute(
        _CAS_RUN,
        {
            "where_id": run_row.id,
            "where_version": run_row.version,
            "version": run_row.version + steps,
            **values,
        },
    )
    if result.rowcount != 1:
        raise VersionConflict(run_row.id)


def _update_attempt(
    conn: Connection, attempt_row: Row[Any], target: AttemptStatus, values: dict[str, Any]
) -> None:
    result = conn.execute(
        _CAS_ATTEMPT,
        {
            "where_id": attempt_row.id,
            "where_status": attempt_row.status,
            "status": target.value,
            **values,
        },
    )
    if result.rowcount != 1:
        raise VersionConflict(attempt_row.run_id)


def _event_rows(
    run_id: str, first_seq: int, at: int, events: Iterable[_Event]
) -> list[dict[str, Any]]:
    return [
        {
            "run_id": run_id,
            "seq": first_seq + offset,
            "type": event.type,
            "at_ms": at,
            "data": canonical_json(event.data).decode("utf-8"),
        }
        for offset, event in enumerate(events)
    ]


def _append_events(
    conn: Connection, run_id: str, first_seq: int, at: int, events: Iterable[_Event]
) -> None:
    conn.execute(_INSERT_EVENTS, _event_rows(run_id, first_seq, at, events))


def _step(
    conn: Connection,
    run_row: Row[Any],
    attempt_row: Row[Any],
    at: int,
    *,
    run_to: RunStatus,
    attempt_to: AttemptStatus,
    attempt_values: dict[str, Any] | None = None,
    run_values: dict[str, Any] | None = None,
    attempt_data: dict[str, Any] | None = None,
    order: Literal["run_first", "attempt_first"],
    counts: Counts | None = None,
    writes: Writes | None = None,
) -> _Written:
    """Move run and attempt together: two CAS updates and two events, one version each.

    Returns what was written, so callers need not read it back inside the writer lock.
    The run row is written before the attempt row, as in every transaction that writes both.

    ``counts`` (PostgreSQL only): count statements and their parameters, by name, taken in
    the step's own statement (``_Written.counts``); they do not see the step's own writes.
    ``writes``: other writes of the transaction, in the step's statement on PostgreSQL (one
    round trip less each), after its writes on SQLite; the rows each changed come back in
    ``_Written.counts`` by name. A refusal raises before any of them.
    """
    transition_run(RunStatus(run_row.status), run_to)
    transition_attempt(AttemptStatus(attempt_row.status), attempt_to)
    run_ev = _Event(run_event(run_to), {})
    att_ev = _Event(
        attempt_event(attempt_to), {"attempt": attempt_row.number, **(attempt_data or {})}
    )
    events = [run_ev, att_ev] if order == "run_first" else [att_ev, run_ev]
    run_set = {"status": run_to.value, **(run_values or {})}
    counted: dict[str, int] = {}
    if conn.dialect.name == "postgresql":
        # One round trip instead of three (app/storage/one_step.py).
        took, counted = write_step(
            conn,
            run_id=run_row.id,
            run_version=run_row.version,
            run_values={**run_set, "version": run_row.version + 2},
            attempt_id=attempt_row.id,
            attempt_status=attempt_row.status,
            attempt_values={"status": attempt_to.value, **(attempt_values or {})},
            event_rows=_event_rows(run_row.id, run_row.version + 1, at, events),
            counts=counts,
            writes=writes,
        )
        if not took:
            raise VersionConflict(run_row.id)
    else:
        if counts:
            raise ValueError("counts in the step's statement are PostgreSQL's only")
        _cas_run(conn, run_row, 2, run_set)
        _update_attempt(conn, attempt_row, attempt_to, attempt_values or {})
        _append_events(conn, run_row.id, run_row.version + 1, at, events)
        counted = run_writes(conn, writes or {})
    return _Written(
        run_row,
        attempt_row,
        {"status": run_to.value, "version": run_row.version + 2, **(run_values or {})},
        {"status": attempt_to.value, **(attempt_values or {})},
        counted,
    )


@dataclass(frozen=True, slots=True)
class _Written:
    """Rows read at the start of a transaction and the columns it then wrote to them.

    Only a caller that needs the result pays for building it, and after the commit (outside
    the writer lock) where it can.
    """

    run_row: Any
    attempt_row: Any
    run_values: dict[str, Any]
    attempt_values: dict[str, Any]
    # What the step's statement counted besides (``_step``'s ``counts``), by name.
    counts: dict[str, int] = field(default_factory=dict)

    def rows(self) -> tuple[Any, Any]:
        """The run and attempt rows as they now stand."""
        return (
            _row_of(runs, self.run_values, self.run_row),
            _row_of(attempts, self.attempt_values, self.attempt_row),
        )

    def run(self) -> Run:
        """The run (with its latest attempt) as it now stands."""
        return run_from_rows(*self.rows())


def _row_of(table: Table, values: dict[str, Any], base: Any = None) -> Any:
    """A row-like value of ``table``: ``values``, else ``base``'s column, else NULL."""
    row = SimpleNamespace(**{c.name: getattr(base, c.name, None) for c in table.c})
    row.__dict__.update(values)
    return row
