"""The receipt journal (ADR-0007 §2.2, §2.5): one row per attempt the worker launched.

States: ``reserved`` (committed before any spawn) → ``spawned`` (handle recorded) or
``spawn_failed``; a spawned entry then ends ``consumed`` (after the terminal transaction)
or ``quarantined`` (bad receipt). Consumption is driven by these rows, never by listing
the receipt directory. Every method is one committed transaction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Row, bindparam, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from app.domain.ids import now_ms
from app.domain.model import ProcessHandle
from app.storage.tables import receipt_journal
from app.storage.uow import UnitOfWork

RESERVED = "reserved"
SPAWNED = "spawned"
SPAWN_FAILED = "spawn_failed"
CONSUMED = "consumed"
QUARANTINED = "quarantined"
STATES = frozenset({RESERVED, SPAWNED, SPAWN_FAILED, CONSUMED, QUARANTINED})
# From which states each target may be reached; anything else is refused (no row changes).
_FROM: dict[str, frozenset[str]] = {
    SPAWNED: frozenset({RESERVED}),
    SPAWN_FAILED: frozenset({RESERVED}),
    CONSUMED: frozenset({SPAWNED, RESERVED}),
    QUARANTINED: frozenset({SPAWNED, RESERVED}),
}
# Built once (see runs_repo): SET columns come from the parameters of each execution.
_INSERT = insert(receipt_journal)
_BY_ATTEMPT = select(receipt_journal).where(receipt_journal.c.attempt_id == bindparam("attempt_id"))
_MOVES = {
    target: update(receipt_journal).where(
        receipt_journal.c.attempt_id == bindparam("where_attempt"),
        receipt_journal.c.state.in_(sorted(sources)),
    )
    for target, sources in _FROM.items()
}


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

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def reserve(self, *, attempt_id: str, run_id: str, receipt_ref: str) -> JournalEntry:
        """Commit a ``reserved`` entry; raise AlreadyReserved if the attempt has one."""
        at = now_ms()
        try:
            with UnitOfWork(self._engine) as uow:
                uow.conn.execute(
                    _INSERT,
                    {
                        "attempt_id": attempt_id,
                        "run_id": run_id,
                        "state": RESERVED,
                        "receipt_ref": receipt_ref,
                        "created_at_ms": at,
                        "updated_at_ms": at,
                    },
                )
                uow.commit()
        except IntegrityError:
            existing = self.get(attempt_id)
            if existing is None:  # pragma: no cover - an integrity error without a row
                raise
            raise AlreadyReserved(existing) from None
        return JournalEntry(attempt_id, run_id, RESERVED, receipt_ref, None, None, at, at)

    def get(self, attempt_id: str) -> JournalEntry | None:
        """The entry of ``attempt_id``, if any."""
        with UnitOfWork(self._engine, write=False) as uow:
            row = uow.conn.execute(_BY_ATTEMPT, {"attempt_id": attempt_id}).first()
        return None if row is None else _entry(row)

    def record_spawned(self, *, attempt_id: str, handle: ProcessHandle) -> bool:
        """reserved → spawned with the handle; False if the entry was not reserved."""
        return self._move(
            attempt_id, SPAWNED, {"handle": json.dumps(handle.to_dict(), sort_keys=True)}
        )

    def record_spawn_failed(self, *, attempt_id: str) -> bool:
        """reserved → spawn_failed; False if the entry was not reserved."""
        return self._move(attempt_id, SPAWN_FAILED, {})

    def mark_consumed(self, *, attempt_id: str) -> bool:
        """→ consumed (after the terminal transaction committed); False if not allowed."""
        return self._move(attempt_id, CONSUMED, {})

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
        query = select(receipt_journal).where(t.state == state)
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
        if state not in (CONSUMED, QUARANTINED, SPAWN_FAILED):
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


def mark_consumed_in(conn: Connection, attempt_id: str) -> bool:
    """→ consumed inside the caller's transaction (the completion transaction's own step)."""
    return _move_in(conn, attempt_id, CONSUMED, {})


def _move_in(conn: Connection, attempt_id: str, target: str, values: dict[str, Any]) -> bool:
    params = {"where_attempt": attempt_id, "state": target, "updated_at_ms": now_ms()}
    result = conn.execute(_MOVES[target], params | values)
    return bool(result.rowcount == 1)
