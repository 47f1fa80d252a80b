"""Schedules: one transaction per change, and the fire of due slots exactly once.

A slot is decided only in the transaction that moves the schedule's durable cursor past it
(a compare-and-set on ``cursor_ms``) and inserts its run (unique on schedule and slot) or its
decision, so any number of loops may call ``fire_due`` at once (docs/schedules.md §2).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Row,
    Select,
    bindparam,
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from app.domain.canonical import canonical_json
from app.domain.errors import (
    Conflict,
    DomainError,
    ErrorCode,
    NotFound,
    PreconditionFailed,
    VersionConflict,
)
from app.domain.ids import now_ms, uuid7
from app.domain.model import Page, Schedule, ScheduleDecision, ScheduleDefinition
from app.domain.states import TERMINAL_RUN, RunStatus
from app.schedule.overlap import ActiveRun, decide_overlap
from app.schedule.slots import (
    CatchupPlan,
    SlotSpec,
    last_slot,
    next_slot,
    plan_catchup,
    slot_jitter_ms,
)
from app.storage.cursor import decode_cursor, encode_cursor
from app.storage.definitions_repo import lock_task, refuse_archived, revision_row
from app.storage.runs_repo import ScheduleTrigger, cancel_in, enqueue_in, queue_has_room
from app.storage.tables import runs, schedule_decisions, schedules
from app.storage.uow import UnitOfWork, retried_on_duplicate

log = logging.getLogger("qinglong.schedules")

_BY_NAME = select(schedules).where(schedules.c.name == bindparam("name"))
_BY_ID = select(schedules).where(schedules.c.id == bindparam("id"))
_NON_TERMINAL = [s.value for s in RunStatus if s not in TERMINAL_RUN]
_ACTIVE_RUNS = (
    select(runs)
    .where(runs.c.schedule_id == bindparam("schedule_id"), runs.c.status.in_(_NON_TERMINAL))
    .order_by(runs.c.slot_ms)
)
_QUEUED_RUNS = select(runs).where(
    runs.c.schedule_id == bindparam("schedule_id"), runs.c.status == RunStatus.QUEUED.value
)
_CAS_SCHEDULE = update(schedules).where(
    schedules.c.id == bindparam("where_id"), schedules.c.cursor_ms == bindparam("where_cursor")
)
_INSERT_DECISION = insert(schedule_decisions)
# How many due schedules one fire_due call decides; the loop calls again at once if full.
FIRE_PAGE = 32
# A slot decided at most this long after its instant is on time, not missed: it fires under
# every catch-up policy (docs/schedules.md §3). The loop wakes at the slot; this absorbs a slow
# transaction or a short restart, not downtime.
ON_TIME_GRACE_MS = 5_000
REFUSAL_LOG_EVERY_S = 60.0
# A schedule this build refuses (a body a newer build stored) is tried again this long after,
# not at every pass: left due, it would fill the due page and starve the schedules behind it.
# A change of the schedule (a new version) is tried at once.
REFUSAL_RETRY_MS = 10_000
DELETED_REASON = "schedule_deleted"
REPLACED_REASON = "replaced"


def spec_of(definition: ScheduleDefinition) -> SlotSpec:
    """The slot arithmetic's view of a definition."""
    return SlotSpec(
        cron=definition.cron,
        every_seconds=definition.every_seconds,
        timezone=definition.timezone,
        dst_gap=definition.dst_gap,
        dst_fold=definition.dst_fold,
        start_at_ms=definition.start_at_ms,
        end_at_ms=definition.end_at_ms,
    )


def _matches(if_match: str, row: Any, *, weak: bool = False) -> bool:
    """RFC 9110 §13.1.1: ``*`` matches any current version; else a list of entity tags
    matches when one of them is the current one (strong comparison: a weak tag never does;
    ``weak``, If-None-Match's comparison, §13.1.2: ``W/"x"`` matches ``"x"``). Ours hold no
    comma, so splitting on commas cannot make one of a client's tags ours."""
    tags = {tag.strip() for tag in if_match.split(",")}
    if weak:
        tags = {tag.removeprefix("W/") for tag in tags}
    return "*" in tags or _schedule_of(row).etag in tags


def _schedule_of(row: Any) -> Schedule:
    return Schedule(
        id=row.id,
        name=row.name,
        definition=ScheduleDefinition.from_body(json.loads(row.body)),
        paused=bool(row.paused),
        version=row.version,
        cursor_ms=row.cursor_ms,
        next_due_ms=row.next_due_ms,
        created_at_ms=row.created_at_ms,
        updated_at_ms=row.updated_at_ms,
    )


def _due_after(
    schedule_id: str, definition: ScheduleDefinition, paused: bool, cursor_ms: int
) -> int | None:
    """When the first slot after the cursor is due: the slot plus its deterministic jitter."""
    if paused:
        return None
    spec = spec_of(definition)
    slot = next_slot(spec, cursor_ms)
    return None if slot is None else _due(spec, schedule_id, definition, slot)


def _due(spec: SlotSpec, schedule_id: str, definition: ScheduleDefinition, slot: int) -> int:
    """When ``slot`` is due: its instant plus its jitter (``slot_jitter_ms``), the one rule of
    ``next_due_ms``, the on-time judgement, the hold of a slot in its jitter and lateness."""
    return slot + slot_jitter_ms(spec, schedule_id, slot, definition.jitter_seconds)


@dataclass(frozen=True, slots=True)
class SlotLateness:
    """How late one slot's decision was committed (``GET /metrics``, docs/metrics.md).

    ``seconds`` runs from the slot's due instant (the slot plus its jitter, what the loop
    sleeps until) to the commit of the transaction that decided it, 0 when that was earlier
    (a backlog slot fires at once, before its own jitter). ``on_time`` when the pass decided
    it within ``ON_TIME_GRACE_MS`` of that instant, the rule that makes a slot on time rather
    than backlog (docs/schedules.md §3).
    """

    seconds: float
    on_time: bool


@dataclass(frozen=True, slots=True)
class FireResult:
    """What one ``fire_due`` call did."""

    runs_created: int
    schedules_decided: int
    page_full: bool
    # Cancel intents recorded on started runs (overlap replace): the worker should stop them.
    cancels_requested: int = 0
    # One per slot decided and committed by this call (fired, queued, replaced, skipped or
    # dropped; the collapsed ``missed`` record is none of them), in no particular order.
    lateness: tuple[SlotLateness, ...] = ()


class ScheduleRepository:
    """Writes schedules and their decisions; every public method is one transaction per change."""

    def __init__(self, engine: Engine, *, max_queued: int | None = None) -> None:
        self._engine = engine
        # QL_MAX_QUEUED: a slot that finds this many runs queued is dropped, not queued
        # (``dropped_queue_full``, docs/concurrency-budgets.md §3).
        self._max_queued = max_queued
        # (schedule id, what and code): when "schedule fire refused" (or "raced") was last
        # written for it: one line a minute, not one a pass; entries older than that go.
        self._refusals_logged: dict[tuple[str, str], float] = {}
        # schedule id -> (its refused version, the instant to try it again): left out of the
        # due page and of the earliest due instant until then.
        self._refused: dict[str, tuple[int, int]] = {}

    # -- definitions -------------------------------------------------------------------------

    def put_schedule(
        self,
        *,
        name: str,
        definition: ScheduleDefinition,
        paused: bool,
        if_match: str | None = None,
        if_none_match: str | None = None,
        at_ms: int | None = None,
    ) -> tuple[Schedule, bool]:
        """Create or replace; ``(schedule, created)``. A change never fires a past slot:
        the cursor becomes the later of now and the old cursor. ``if_none_match`` (``*``, or
        tags none of which may be current): PreconditionFailed when the schedule exists (and
        matches), so a create never replaces one made meanwhile."""
        put = functools.partial(
            self._put_schedule_once, name=name, definition=definition, paused=paused,
            if_match=if_match, if_none_match=if_none_match, at_ms=at_ms,
        )  # fmt: skip
        # A concurrent put may create this name first: the next try reads it (If-None-Match
        # refuses it, or the put replaces it). Only a delete between each try and the next
        # create can make the third fail.
        return retried_on_duplicate(put, tries=3)

    def _put_schedule_once(
        self,
        *,
        name: str,
        definition: ScheduleDefinition,
        paused: bool,
        if_match: str | None,
        if_none_match: str | None,
        at_ms: int | None,
    ) -> tuple[Schedule, bool]:
        at = now_ms() if at_ms is None else at_ms
        body = canonical_json(definition.body()).decode("utf-8")
        with UnitOfWork(self._engine) as uow:
            conn = uow.conn
            # The schedule's row first, then the task's lock: resume takes them in this order.
            row = conn.execute(_locked(conn, _BY_NAME), {"name": name}).first()
            if not paused:
                lock_task(conn, definition.task)
            rev = revision_row(conn, definition.task, definition.revision)  # TASK_NOT_FOUND
            if not paused:  # a paused schedule of an archived task fires nothing
                refuse_archived(rev, "a schedule of it must be paused")
            if if_match is not None and (row is None or not _matches(if_match, row)):
                raise PreconditionFailed()
            if (
                if_none_match is not None and row is not None
                and _matches(if_none_match, row, weak=True)
            ):  # fmt: skip
                raise PreconditionFailed(f"the schedule {name} exists (If-None-Match)")
            if row is None:
                new_id = uuid7(at)
                values = {
                    "id": new_id,
                    "name": name,
                    "body": body,
                    "version": 1,
                    "cursor_ms": at,
                    "next_due_ms": _due_after(new_id, definition, paused, at),
                    "paused": paused,
                    "created_at_ms": at,
                    "updated_at_ms": at,
                }
                conn.execute(insert(schedules), values)
                uow.commit()
                return _schedule_of(_Row(values)), True
            if row.body == body and bool(row.paused) == paused:
                return _schedule_of(row), False
            cursor = max(at, row.cursor_ms)
            values = {
                "body": body,
                "version": row.version + 1,
                "cursor_ms": cursor,
                "next_due_ms": _due_after(row.id, definition, paused, cursor),
                "paused": paused,
                "updated_at_ms": at,
            }
            conn.execute(update(schedules).where(schedules.c.id == row.id), values)
            uow.commit()
            return _schedule_of(_Row({**row._asdict(), **values})), False

    def pause(self, *, name: str) -> Schedule:
        """Stop deciding slots; the cursor stays where it is, so resume can catch up."""
        return self._set_paused(name, True)

    def resume(self, *, name: str) -> Schedule:
        """Decide slots again from the cursor: the catch-up policy applies to the paused span."""
        return self._set_paused(name, False)

    def _set_paused(self, name: str, paused: bool) -> Schedule:
        at = now_ms()
        with UnitOfWork(self._engine) as uow:
            conn = uow.conn
            row = _require(conn, name)
            if bool(row.paused) == paused:
                return _schedule_of(row)
            definition = ScheduleDefinition.from_body(json.loads(row.body))
            if not paused:
                lock_task(conn, definition.task)
                refuse_archived(
                    revision_row(conn, definition.task, None), "its schedules stay paused"
                )
            values = {
                "paused": paused,
                "version": row.version + 1,
                "next_due_ms": _due_after(row.id, definition, paused, row.cursor_ms),
                "updated_at_ms": at,
            }
            conn.execute(update(schedules).where(schedules.c.id == row.id), values)
            uow.commit()
            return _schedule_of(_Row({**row._asdict(), **values}))

    def delete(self, *, name: str) -> int:
        """Delete the schedule and its decisions and cancel its queued runs, in one
        transaction; the number of runs cancelled. Runs already started go on."""
        for _ in range(3):
            try:
                return self._delete_once(name)
            except VersionConflict:
                continue  # a queued run was dispatched meanwhile: decide again
        raise VersionConflict("schedule delete")

    def _delete_once(self, name: str) -> int:
        at = now_ms()
        with UnitOfWork(self._engine) as uow:
            conn = uow.conn
            row = _require(conn, name)
            queued = conn.execute(_QUEUED_RUNS, {"schedule_id": row.id}).all()
            for run_row in queued:
                cancel_in(conn, run_row, DELETED_REASON, at)
            conn.execute(
                delete(schedule_decisions).where(schedule_decisions.c.schedule_id == row.id)
            )
            conn.execute(delete(schedules).where(schedules.c.id == row.id))
            uow.commit()
            return len(queued)

    # -- reads -----------------------------------------------------------------------------

    def get(self, *, name: str) -> Schedule:
        """The schedule; NotFound SCHEDULE_NOT_FOUND."""
        with self._engine.connect() as conn:
            return _schedule_of(_require(conn, name, lock=False))

    def list_schedules(self, *, limit: int, cursor: str | None) -> Page[Schedule]:
        """A keyset page of schedules in name order."""
        query = select(schedules).order_by(schedules.c.name).limit(limit + 1)
        if cursor is not None:
            (after,) = decode_cursor("schedules", cursor, (str,))
            query = query.where(schedules.c.name > after)
        with self._engine.connect() as conn:
            rows = conn.execute(query).all()
        items = [_schedule_of(r) for r in rows[:limit]]
        nxt = encode_cursor("schedules", [items[-1].name]) if len(rows) > limit else None
        return Page(items=items, next_cursor=nxt)

    def decisions(self, *, name: str, limit: int, cursor: str | None) -> Page[ScheduleDecision]:
        """A keyset page of the schedule's decisions, newest first."""
        t = schedule_decisions
        with self._engine.connect() as conn:
            row = _require(conn, name, lock=False)
            query = (
                select(t).where(t.c.schedule_id == row.id).order_by(t.c.id.desc()).limit(limit + 1)
            )
            if cursor is not None:
                (before,) = decode_cursor("decisions", cursor, (str,))
                query = query.where(t.c.id < before)
            rows = conn.execute(query).all()
        items = [
            ScheduleDecision(
                slot_ms=r.slot_ms,
                decision=r.decision,
                run_id=r.run_id,
                count=r._mapping["count"],
                until_slot_ms=r.until_slot_ms,
                at_ms=r.at_ms,
            )
            for r in rows[:limit]
        ]
        nxt = encode_cursor("decisions", [rows[limit - 1].id]) if len(rows) > limit else None
        return Page(items=items, next_cursor=nxt)

    def earliest_due_ms(self, now: int | None = None) -> int | None:
        """The earliest ``next_due_ms`` of any schedule (one indexed query), or None; a
        refused schedule counts from the instant it is to be tried again."""
        at = now_ms() if now is None else now
        query = select(schedules.c.id, schedules.c.version, schedules.c.next_due_ms).where(
            schedules.c.next_due_ms.is_not(None)
        )
        first = self._unrefused(query.order_by(schedules.c.next_due_ms), 1, at)
        retries = [until for _, until in self._refused.values()]
        return min([*retries, *(row.next_due_ms for row in first)], default=None)

    def _unrefused(self, query: Select[Any], limit: int, at: int) -> list[Row[Any]]:
        """The first ``limit`` rows of ``query`` (of schedules: id, version, ...) but those
        refused at their current version whose retry has not come; forgets the retries that
        have. The refused are skipped here, not in SQL: a rollback may leave thousands, more
        than a statement may bind."""
        self._refused = {k: v for k, v in self._refused.items() if v[1] > at}
        with self._engine.connect() as conn:
            rows = conn.execute(query.limit(limit + len(self._refused))).all()
        kept = [r for r in rows if self._refused.get(r.id, (None,))[0] != r.version]
        return kept[:limit]

    # -- the fire --------------------------------------------------------------------------

    def fire_due(self, now: int | None = None, *, page: int = FIRE_PAGE) -> FireResult:
        """Decide every due slot of up to ``page`` due schedules, one transaction each."""
        at = now_ms() if now is None else now
        began = time.perf_counter()  # a commit's instant is ``at`` plus the time since
        due = select(schedules.c.id, schedules.c.version).where(schedules.c.next_due_ms <= at)
        ids = self._unrefused(due.order_by(schedules.c.next_due_ms), page, at)
        created = decided = cancels = 0
        lateness: list[SlotLateness] = []
        for schedule_id, version in ((row.id, row.version) for row in ids):
            try:
                made = self._fire_one(schedule_id, at, began)
            except IntegrityError:
                made = None  # another loop inserted the slot's run first: its commit decided
            except (VersionConflict, Conflict) as exc:
                # A run of the schedule moved first (overlap replace's cancel lost its
                # compare-and-set to the dispatcher or an ending): tried again next pass.
                self._log_once_a_minute(logging.INFO, "schedule fire raced", schedule_id, exc)
                made = None
            except DomainError as exc:
                # One schedule refused (a body or pinned revision this build cannot read) must
                # not hold back the others due behind it: it stays due, left out until its retry.
                self._refused[schedule_id] = (version, at + REFUSAL_RETRY_MS)
                self._log_once_a_minute(logging.ERROR, "schedule fire refused", schedule_id, exc)
                made = None
            if made is not None:
                created += made[0]
                cancels += made[1]
                lateness.extend(made[2])
                decided += 1
        return FireResult(
            runs_created=created,
            schedules_decided=decided,
            page_full=len(ids) == page,
            cancels_requested=cancels,
            lateness=tuple(lateness),
        )

    def _log_once_a_minute(
        self, level: int, what: str, schedule_id: str, exc: DomainError
    ) -> None:
        """``what: CODE (schedule ID)``, at most once a minute for each schedule and code."""
        key, clock = (schedule_id, f"{what}:{exc.code}"), time.monotonic()
        if clock - self._refusals_logged.get(key, -REFUSAL_LOG_EVERY_S) >= REFUSAL_LOG_EVERY_S:
            self._refusals_logged = {
                k: t for k, t in self._refusals_logged.items() if clock - t < REFUSAL_LOG_EVERY_S
            }
            self._refusals_logged[key] = clock
            log.log(level, "%s: %s (schedule %s)", what, exc.code, schedule_id)

    def _fire_one(
        self, schedule_id: str, at: int, began: float
    ) -> tuple[int, int, list[SlotLateness]] | None:
        """One schedule's due slots in one transaction; (runs created, cancel intents on
        started runs, each decided slot's lateness at the commit), None when another loop
        decided them first (locked, or the cursor moved)."""
        with UnitOfWork(self._engine) as uow:
            conn = uow.conn
            row = conn.execute(_locked(conn, _BY_ID, skip=True), {"id": schedule_id}).first()
            if row is None or row.next_due_ms is None or row.next_due_ms > at or row.paused:
                return None
            definition = ScheduleDefinition.from_body(json.loads(row.body))
            spec = spec_of(definition)
            plan = _plan(spec, definition, row.id, row.cursor_ms, at)
            # A newest slot still in its jitter is not in the plan: the cursor stays just
            # before it until its instant plus its jitter (the same after a crash, §4).
            fire, cursor = plan.fire, plan.cursor_ms
            decisions: list[dict[str, Any]] = []
            if plan.missed_count and plan.missed_first_ms is not None:
                decisions.append(
                    _decision(
                        row.id,
                        plan.missed_first_ms,
                        "missed",
                        at,
                        None,
                        plan.missed_count,
                        plan.missed_last_ms,
                    )
                )
            created = cancels = 0
            # The schedule's runs not ended, kept up to date through the pass (an earlier slot
            # of catch-up "all" may create or cancel one): one read per pass.
            rows: dict[str, Any] = {}
            active: list[ActiveRun] = []
            if fire:
                if self._max_queued is not None:
                    # The task's lock (shared) before the queue's, the order of POST /runs
                    # (whose enqueue takes the task's first): the other order waits for the
                    # deadlock check (1 s) once an archive or a new revision of the task is
                    # waiting too.
                    lock_task(conn, definition.task, shared=True)
                for r in conn.execute(_ACTIVE_RUNS, {"schedule_id": row.id}):
                    rows[r.id] = r
                    active.append(ActiveRun(r.id, r.slot_ms, r.status, r.cancel_reason is not None))
            for slot in fire:
                choice = decide_overlap(definition.overlap, definition.max_concurrent, active)
                if not choice.creates:
                    decisions.append(_decision(row.id, slot, choice.kind, at, choice.blocking_run))
                    continue
                if self._max_queued is not None and not queue_has_room(conn, self._max_queued):
                    decisions.append(_decision(row.id, slot, "dropped_queue_full", at, None))
                    continue
                for run_id in choice.cancel:  # the one cancel path (runs_repo.cancel_in)
                    cancel_in(conn, rows[run_id], REPLACED_REASON, at)
                    queued = rows[run_id].status == RunStatus.QUEUED.value
                    cancels += not queued
                    active = [
                        a if a.id != run_id else ActiveRun(a.id, a.slot_ms, a.status, True)
                        for a in active
                        if not (a.id == run_id and queued)  # a queued one ended cancelled
                    ]
                run_values, _ = enqueue_in(
                    conn,
                    task=definition.task,
                    revision=definition.revision,
                    priority=None,
                    at=at,
                    trigger=ScheduleTrigger(row.id, row.name, slot),
                    hold_from_slot_ms=choice.hold_from_slot_ms,
                )
                rows[run_values["id"]] = _Row(run_values)
                active.append(ActiveRun(run_values["id"], slot, RunStatus.QUEUED.value, False))
                decisions.append(_decision(row.id, slot, choice.kind, at, run_values["id"]))
                created += 1
            if decisions:
                conn.execute(_INSERT_DECISION, decisions)
            moved = conn.execute(
                _CAS_SCHEDULE,
                {
                    "where_id": row.id,
                    "where_cursor": row.cursor_ms,
                    "cursor_ms": cursor,
                    "next_due_ms": _due_after(row.id, definition, False, cursor),
                },
            )
            if moved.rowcount != 1:
                return None  # rolled back: another loop moved the cursor first
            uow.commit()
            committed = at + (time.perf_counter() - began) * 1000
            lateness = []
            for slot in fire:
                due = _due(spec, row.id, definition, slot)
                late_s = max(committed - due, 0.0) / 1000
                # A backlog slot fired before its jittered instant is caught up, not on time.
                lateness.append(SlotLateness(late_s, 0 <= at - due <= ON_TIME_GRACE_MS))
            return created, cancels, lateness


def _plan(
    spec: SlotSpec, definition: ScheduleDefinition, schedule_id: str, cursor: int, at: int
) -> CatchupPlan:
    """The slots to fire and to record missed in (cursor, at].

    The catch-up policy governs the backlog only: the newest due slot, when it is on time
    (decided within ``ON_TIME_GRACE_MS`` of its instant plus its jitter), fires under
    ``latest`` and ``none`` alike, and the older ones are the backlog (``latest`` is then
    satisfied by the on-time slot). ``all`` fires in order as it is (docs/schedules.md §3).
    A newest slot still in its jitter is not due: it is held (the cursor stays just before
    it) and the slot before it is the one judged, so a pass a few ms after a jittered slot's
    due instant, once the next slot's instant has passed too, fires it rather than calling it
    missed (its jitter ends before that instant: ``slot_jitter_ms``).
    """
    window_s = definition.catchup_window_seconds
    if at <= cursor:
        return plan_catchup(spec, cursor, at, catchup=definition.catchup, window_s=window_s)
    until = at
    newest = last_slot(spec, cursor, at)
    if newest is not None and _due(spec, schedule_id, definition, newest) > at:
        until = newest - 1  # under ``all`` too: past 100 slots it is not in the missed range
        newest = last_slot(spec, cursor, until)
    if (
        definition.catchup == "all"
        or newest is None
        or at - _due(spec, schedule_id, definition, newest) > ON_TIME_GRACE_MS
    ):
        return plan_catchup(spec, cursor, until, catchup=definition.catchup, window_s=window_s)
    backlog = plan_catchup(spec, cursor, newest - 1, catchup="none", window_s=window_s)
    return CatchupPlan(
        (newest,), backlog.missed_count, backlog.missed_first_ms, backlog.missed_last_ms, until
    )


class _Row:
    """Attribute access over inserted values, as a Row gives it."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)


def _decision(
    schedule_id: str,
    slot_ms: int,
    decision: str,
    at: int,
    run_id: str | None,
    count: int = 1,
    until_slot_ms: int | None = None,
) -> dict[str, Any]:
    return {
        "id": uuid7(at),
        "schedule_id": schedule_id,
        "slot_ms": slot_ms,
        "decision": decision,
        "run_id": run_id,
        "count": count,
        "until_slot_ms": until_slot_ms,
        "at_ms": at,
    }


def _locked(conn: Connection, query: Any, *, skip: bool = False) -> Any:
    """``query`` FOR UPDATE on PostgreSQL (SKIP LOCKED for the fire); SQLite's write
    transaction already holds the one writer lock."""
    if conn.dialect.name == "postgresql":
        return query.with_for_update(skip_locked=skip)
    return query


def _require(conn: Connection, name: str, *, lock: bool = True) -> Row[Any]:
    row = conn.execute(_locked(conn, _BY_NAME) if lock else _BY_NAME, {"name": name}).first()
    if row is None:
        raise NotFound(ErrorCode.SCHEDULE_NOT_FOUND, f"no schedule named {name}")
    return row
