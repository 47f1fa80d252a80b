"""The receipt journal (docs/design.md §5.4): one row per attempt the worker launched.

States: ``reserved`` (committed before any spawn) → ``spawned`` (handle recorded) or
``spawn_failed``; a spawned entry then ends ``consumed`` (after the terminal transaction)
or ``quarantined`` (bad receipt). ``fenced`` is written by recovery instead of a launch, for
a start that never reached the worker: the primary key then refuses any late reservation
of that attempt, so recovery may requeue the run knowing nothing can spawn for it. A
``reserved`` entry becomes ``fenced`` too once recovery holds the shim's receipt
reservation name (no shim can start the job any more).
Consumption is driven by these rows, never by listing the receipt directory. Every method
is one committed transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Row,
    String,
    Text,
    Update,
    bindparam,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from app.domain.artifacts import receipt_relpath
from app.domain.ids import now_ms
from app.domain.journal import (
    CONSUMED,
    FENCED,
    QUARANTINED,
    RESERVED,
    SPAWN_FAILED,
    SPAWNED,
    STATES,
)
from app.domain.model import ProcessHandle
from app.storage.one_step import run_writes
from app.storage.tables import attempts, receipt_journal
from app.storage.uow import UnitOfWork

# The states are re-exported: the launcher and the tests name them from their adapter.
__all__ = [
    "CONSUMED",
    "FENCED",
    "QUARANTINED",
    "RESERVED",
    "SPAWNED",
    "SPAWN_FAILED",
    "STATES",
    "AlreadyReserved",
    "JournalEntry",
    "JournalRepository",
    "NotStarting",
    "consumed_move",
    "mark_consumed_in",
    "mark_spawned_in",
    "spawned_move",
]
# From which states each target may be reached; anything else is refused (no row changes).
_FROM: dict[str, frozenset[str]] = {
    SPAWNED: frozenset({RESERVED}),
    SPAWN_FAILED: frozenset({RESERVED}),
    CONSUMED: frozenset({SPAWNED, RESERVED}),
    QUARANTINED: frozenset({SPAWNED, RESERVED}),
    # Recovery took the shim's receipt reservation name first: no shim can start the job.
    FENCED: frozenset({RESERVED}),
}
# Built once (see runs_repo): SET columns come from the parameters of each execution.
_INSERT = insert(receipt_journal)
# A reservation only for an attempt the database has in ``starting`` (T1 committed, no
# ending since): a request that arrives after recovery requeued its attempt, even once the
# fence row itself is purged, can never spawn.
def _reserve_starting(owned: bool, prefix: str = "") -> Any:
    # ``owned`` (several hosts, docs/several-hosts.md §2): only an attempt T1 gave to this
    # instance (or to none), and the entry names the instance. ``prefix``: every value a
    # parameter named ``prefix + name``, the constants too (``_RESERVE_CONSTANTS``), for the
    # statement nested as a CTE (``_reserve_and_stamp``).
    def param(name: str, type_: Any = None) -> Any:
        return bindparam(f"{prefix}{name}", type_=type_)

    state = param("reserved_state", String) if prefix else literal(RESERVED, String)
    starting = param("starting_status", String) if prefix else "starting"
    where = [
        attempts.c.id == param("attempt_id"),
        attempts.c.run_id == param("run_id"),
        attempts.c.status == starting,
    ]
    if owned:
        where.append(
            or_(
                attempts.c.worker_instance_id.is_(None),
                attempts.c.worker_instance_id == param("worker_instance_id", String),
            )
        )
    return (
        insert(receipt_journal)
        .from_select(
            [
                "attempt_id", "run_id", "state", "receipt_ref", "created_at_ms",
                "updated_at_ms", "worker_instance_id",
            ],
            select(
                attempts.c.id,
                attempts.c.run_id,
                state,
                param("receipt_ref", String),
                param("created_at_ms", BigInteger),
                param("updated_at_ms", BigInteger),
                param("worker_instance_id", String),
            ).where(*where),
        )
        .returning(receipt_journal.c.attempt_id)
    )  # an INSERT's rowcount is -1 on psycopg


_RESERVE_STARTING = {owned: _reserve_starting(owned) for owned in (False, True)}
# The worker that reserves stamps its own epoch on the attempt (the api's ping may be older).
_STAMP_EPOCH = (
    update(attempts)
    .where(attempts.c.id == bindparam("where_id"), attempts.c.status == "starting")
    .values(
        worker_instance_id=bindparam("stamp_instance"), lease_epoch=bindparam("stamp_epoch")
    )
)


def _reserve_and_stamp() -> Any:
    """PostgreSQL: the owned reserve and the epoch stamp as one statement (one round trip
    less before the spawn; app/storage/one_step.py has the same shape). The stamp runs only
    when the entry was inserted; the answer's first column is how many entries were."""
    # Every value a named parameter, none named like a column: SQLAlchemy turns a parameter
    # named like a column of a DML statement into one more SET or VALUES entry, also when the
    # statement is nested as a CTE ("a value is required for bind parameter").
    reserved = _reserve_starting(True, prefix="j_").cte("j")
    stamped = (
        update(attempts)
        .where(
            attempts.c.id == bindparam("j_where_id"),
            attempts.c.status == bindparam("j_starting_status", type_=String),
            exists(select(reserved.c.attempt_id)),
        )
        .values(
            worker_instance_id=bindparam("j_stamp_instance", type_=String),
            lease_epoch=bindparam("j_stamp_epoch", type_=BigInteger),
        )
        .returning(attempts.c.id)
        .cte("s")
    )
    # Both counted, so both are part of the statement; the stamp's count is not asked for,
    # as the separate UPDATE's rowcount was not.
    return select(
        select(func.count()).select_from(reserved).scalar_subquery(),
        select(func.count()).select_from(stamped).scalar_subquery(),
    )


_RESERVE_AND_STAMP = _reserve_and_stamp()
_RESERVE_CONSTANTS = {"j_reserved_state": RESERVED, "j_starting_status": "starting"}
_BY_ATTEMPT = select(receipt_journal).where(receipt_journal.c.attempt_id == bindparam("attempt_id"))
_MOVES = {
    target: update(receipt_journal).where(
        receipt_journal.c.attempt_id == bindparam("where_attempt"),
        receipt_journal.c.state.in_(sorted(sources)),
    )
    for target, sources in _FROM.items()
}


class NotStarting(Exception):
    """The attempt is not ``starting`` in the database: a launch must not spawn it."""


class AlreadyReserved(Exception):
    """The attempt already has a journal entry: the launch must not spawn again."""

    def __init__(self, entry: JournalEntry) -> None:
        super().__init__(entry.state)
        self.entry = entry


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One journal row. ``receipt_ref`` is relative to the receipts root."""

    attempt_id: str
    run_id: str
    state: str
    receipt_ref: str
    handle: ProcessHandle | None
    quarantine_reason: str | None
    created_at_ms: int
    updated_at_ms: int


def _entry(row: Row[Any]) -> JournalEntry:
    handle = None
    if row.handle is not None:
        try:
            handle = ProcessHandle.from_dict(json.loads(row.handle))
        except (ValueError, TypeError):
            handle = None  # unreadable handle: the reconciler fails closed on it
    return JournalEntry(
        attempt_id=row.attempt_id,
        run_id=row.run_id,
        state=row.state,
        receipt_ref=row.receipt_ref,
        handle=handle,
        quarantine_reason=row.quarantine_reason,
        created_at_ms=row.created_at_ms,
        updated_at_ms=row.updated_at_ms,
    )


class JournalRepository:
    """Reads and writes ``receipt_journal``."""

    def __init__(
        self,
        engine: Engine,
        *,
        owner: Callable[[], tuple[str, int]] | None = None,
        scoped: bool = False,
    ) -> None:
        self._engine = engine
        # This worker's (instance id, lease epoch): its entries and its attempts name them.
        # ``scoped`` (several hosts, docs/several-hosts.md §2): its pages list only its own
        # entries (and those from before migration 0008, which name none).
        self._owner = owner
        self._own: list[Any] = []
        if owner is not None and scoped:
            me = owner()[0]
            t = receipt_journal.c
            self._own = [or_(t.worker_instance_id == me, t.worker_instance_id.is_(None))]

    def reserve(
        self, *, attempt_id: str, run_id: str, receipt_ref: str, only_if_starting: bool = False
    ) -> JournalEntry:
        """Commit a ``reserved`` entry; raise AlreadyReserved if the attempt has one.

        ``only_if_starting`` (the launcher always sets it): raise NotStarting instead of
        reserving when the attempt is not ``starting`` in the database.
        """
        at = now_ms()
        values = {
            "attempt_id": attempt_id,
            "run_id": run_id,
            "state": RESERVED,
            "receipt_ref": receipt_ref,
            "created_at_ms": at,
            "updated_at_ms": at,
        }
        owner = self._owner() if self._owner is not None else None
        values["worker_instance_id"] = None if owner is None else owner[0]
        try:
            # On PostgreSQL each branch below is one statement (one_statement: no BEGIN and
            # COMMIT round trips on the launch path, docs/design.md §3.15).
            with UnitOfWork(self._engine, grouped=True, one_statement=True) as uow:
                inserted = True
                if only_if_starting:
                    del values["state"]
                    stamp: dict[str, Any] = {}
                    if owner is not None:
                        stamp = {"where_id": attempt_id, "stamp_instance": owner[0]}
                        stamp["stamp_epoch"] = owner[1]
                    if stamp and uow.conn.dialect.name == "postgresql":
                        named = values | stamp
                        params = {f"j_{k}": v for k, v in named.items()} | _RESERVE_CONSTANTS
                        counts = uow.conn.execute(_RESERVE_AND_STAMP, params).one()
                        inserted = counts[0] == 1
                    else:
                        statement = _RESERVE_STARTING[owner is not None]
                        inserted = uow.conn.execute(statement, values).first() is not None
                        if inserted and stamp:
                            uow.conn.execute(_STAMP_EPOCH, stamp)
                else:
                    uow.conn.execute(_INSERT, values)
                uow.commit()
        except IntegrityError:
            inserted = False
        if not inserted:
            existing = self.get(attempt_id)
            if existing is None:
                raise NotStarting(attempt_id) from None
            raise AlreadyReserved(existing) from None
        return JournalEntry(attempt_id, run_id, RESERVED, receipt_ref, None, None, at, at)

    def fence(self, *, attempt_id: str, run_id: str) -> JournalEntry:
        """Commit a ``fenced`` entry so that no launch can reserve this attempt any more.

        Returns the entry that stands afterwards: the fence, or the launch's own entry when
        its reservation came first (then the launch owns the attempt, not recovery).
        """
        at = now_ms()
        ref = receipt_relpath(attempt_id)
        values = {
            "attempt_id": attempt_id,
            "run_id": run_id,
            "state": FENCED,
            "receipt_ref": ref,
            "created_at_ms": at,
            "updated_at_ms": at,
            "worker_instance_id": None if self._owner is None else self._owner()[0],
        }
        try:
            with UnitOfWork(self._engine) as uow:
                uow.conn.execute(_INSERT, values)
                uow.commit()
        except IntegrityError:
            existing = self.get(attempt_id)
            if existing is None:  # pragma: no cover - an integrity error without a row
                raise
            return existing
        return JournalEntry(attempt_id, run_id, FENCED, ref, None, None, at, at)

    def get(self, attempt_id: str) -> JournalEntry | None:
        """The entry of ``attempt_id``, if any."""
        with UnitOfWork(self._engine, write=False) as uow:
            row = uow.conn.execute(_BY_ATTEMPT, {"attempt_id": attempt_id}).first()
        return None if row is None else _entry(row)

    def record_spawned(self, *, attempt_id: str, handle: ProcessHandle) -> bool:
        """reserved → spawned with the handle; False if the entry was not reserved."""
        with UnitOfWork(self._engine) as uow:
            moved = mark_spawned_in(uow.conn, attempt_id, handle)
            uow.commit()
        return moved

    def record_spawn_failed(self, *, attempt_id: str) -> bool:
        """reserved → spawn_failed; False if the entry was not reserved."""
        return self._move(attempt_id, SPAWN_FAILED, {})

    def mark_consumed(self, *, attempt_id: str) -> bool:
        """→ consumed (after the terminal transaction committed); False if not allowed."""
        return self._move(attempt_id, CONSUMED, {})

    def mark_fenced(self, *, attempt_id: str) -> bool:
        """reserved → fenced (recovery holds the receipt reservation); False if not reserved."""
        return self._move(attempt_id, FENCED, {})

    def mark_quarantined(self, *, attempt_id: str, reason: str) -> bool:
        """→ quarantined with a stable reason code; False if not allowed."""
        return self._move(attempt_id, QUARANTINED, {"quarantine_reason": reason[:32]})

    def page_by_state(
        self, *, state: str, limit: int, after: tuple[int, str] | None = None
    ) -> list[JournalEntry]:
        """Entries in ``state`` ordered by (updated_at_ms, attempt_id), after a keyset cursor."""
        if state not in STATES:
            raise ValueError(f"unknown journal state {state!r}")
        t = receipt_journal.c
        query = select(receipt_journal).where(t.state == state, *self._own)
        if after is not None:
            at, attempt_id = after
            query = query.where(
                (t.updated_at_ms > at) | ((t.updated_at_ms == at) & (t.attempt_id > attempt_id))
            )
        query = query.order_by(t.updated_at_ms, t.attempt_id).limit(limit)
        with UnitOfWork(self._engine, write=False) as uow:
            rows = uow.conn.execute(query).all()
        return [_entry(r) for r in rows]

    def delete_settled(self, *, attempt_id: str, state: str) -> bool:
        """Delete the entry if it is still in ``state`` (retention); False otherwise."""
        if state not in (CONSUMED, QUARANTINED, SPAWN_FAILED, FENCED):
            raise ValueError(f"journal entries in {state!r} are never purged")
        t = receipt_journal.c
        with UnitOfWork(self._engine) as uow:
            result = uow.conn.execute(
                delete(receipt_journal).where(t.attempt_id == attempt_id, t.state == state)
            )
            uow.commit()
        return bool(result.rowcount == 1)

    def _move(self, attempt_id: str, target: str, values: dict[str, Any]) -> bool:
        with UnitOfWork(self._engine) as uow:
            moved = _move_in(uow.conn, attempt_id, target, values)
            uow.commit()
        return moved


# The moves as writes a transition's statement carries (one_step.Writes): every value a
# bound parameter named apart from every column of runs, attempts and the journal.
_RIDING_MOVES = {
    target: update(receipt_journal)
    .where(
        receipt_journal.c.attempt_id == bindparam("jm_where_attempt"),
        receipt_journal.c.state.in_(sorted(sources)),
    )
    .values(
        state=bindparam("jm_state", type_=String),
        updated_at_ms=bindparam("jm_updated_at_ms", type_=BigInteger),
        **({"handle": bindparam("jm_handle", type_=Text)} if target == SPAWNED else {}),
    )
    for target, sources in _FROM.items()
    if target in (SPAWNED, CONSUMED)
}


def spawned_move(attempt_id: str, handle: ProcessHandle) -> tuple[Update, dict[str, Any]]:
    """reserved → spawned with the handle, as a write riding in T2's statement."""
    params = _riding_params(attempt_id, SPAWNED)
    params["jm_handle"] = json.dumps(handle.to_dict(), sort_keys=True)
    return _RIDING_MOVES[SPAWNED], params


def consumed_move(attempt_id: str) -> tuple[Update, dict[str, Any]]:
    """→ consumed, as a write riding in a completion's statement."""
    return _RIDING_MOVES[CONSUMED], _riding_params(attempt_id, CONSUMED)


def _riding_params(attempt_id: str, target: str) -> dict[str, Any]:
    return {"jm_where_attempt": attempt_id, "jm_state": target, "jm_updated_at_ms": now_ms()}


def mark_spawned_in(conn: Connection, attempt_id: str, handle: ProcessHandle) -> bool:
    """reserved → spawned with the handle inside the caller's transaction, as a statement of
    its own (the worker's T2 when T2 is refused)."""
    return run_writes(conn, {SPAWNED: spawned_move(attempt_id, handle)})[SPAWNED] == 1


def mark_consumed_in(conn: Connection, attempt_id: str) -> bool:
    """→ consumed inside the caller's transaction, as a statement of its own (a completion
    that finds the attempt already ended)."""
    return run_writes(conn, {CONSUMED: consumed_move(attempt_id)})[CONSUMED] == 1


def _move_in(conn: Connection, attempt_id: str, target: str, values: dict[str, Any]) -> bool:
    params = {"where_attempt": attempt_id, "state": target, "updated_at_ms": now_ms()}
    result = conn.execute(_MOVES[target], params | values)
    return bool(result.rowcount == 1)
