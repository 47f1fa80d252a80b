"""A vanished host's attempts (docs/several-hosts.md §4), decided by a live worker elsewhere.

On PostgreSQL every instance holds its own lease. Once another instance's lease has expired
(by the database's clock) with attempts of it still starting or running, a live worker ends
them: one transaction locks that lease row, checks it is still expired at the epoch read,
bumps its epoch (so the vanished worker, should it come back, finds itself superseded: its
renewal, its completions and its launches are refused), ends up to ``limit`` of its active
attempts ``lost`` ``WORKER_LEASE_EXPIRED`` (compare-and-set on each run, with events) and
appends a ``worker.lease_expired`` service event. A host with more attempts than ``limit``
is superseded again by the next pass, page by page; one with none is never written.
Nothing here touches a process or a file: they are on the other host, whose own worker
stops what is left of them when it comes back (its journal sweep, docs/journal-settle.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Integer, Row, bindparam, delete, select, update
from sqlalchemy.exc import OperationalError

from app.domain.errors import ErrorCode
from app.domain.lease import WORKER_LEASE_EXPIRED, WORKER_RETIRED
from app.storage.lease_repo import append_service_event, db_now_ms
from app.storage.runs_repo import lose_in
from app.storage.tables import ACTIVE_ATTEMPT, attempts, retention_sweeps, worker_leases
from app.storage.uow import UnitOfWork

_L = worker_leases.c
# The longest this pass waits for a row lock. A host frozen or cut off inside a transaction
# (its renewal, a run's compare-and-set) holds its locks until the server ends that session
# (docs/several-hosts.md §4); waiting on them would stall the live worker's lease thread,
# and with it that worker's own renewals. That host is passed over instead (its transaction
# rolled back whole) and a later pass tries it again.
EXPIRY_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '1s'"
_LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's lock_not_available: the timeout above ran out
log = logging.getLogger(__name__)
# Attempts of another host ended per transaction, by a live worker's expiry pass and by an
# operator's ``lease retire`` alike: the lock on that host's lease row is held this long.
HOST_PAGE = 64
# A host's attempts starting or running, by id (ix_attempts_worker_instance_id_status, whose
# predicate the query repeats as its own).
HOST_ACTIVE_PAGE = (
    select(attempts.c.id, attempts.c.run_id)
    .where(attempts.c.worker_instance_id == bindparam("instance"), ACTIVE_ATTEMPT)
    .order_by(attempts.c.id)
    .limit(bindparam("limit", type_=Integer, literal_execute=True))  # as run_reads.PAGE_LIMIT
)


@dataclass(frozen=True, slots=True)
class ExpiredHost:
    """One vanished host whose attempts a pass ended (content-free facts)."""

    instance_id: str
    host: str
    old_epoch: int
    new_epoch: int
    lost: int


def expire_vanished_hosts(
    engine: Engine, *, me_slot: str, me_instance_id: str, me_host: str, limit: int
) -> list[ExpiredHost]:
    """End the active attempts of every other instance whose lease expired (bounded).

    A host whose rows stay locked past ``EXPIRY_LOCK_TIMEOUT`` is passed over (its
    transaction rolled back whole) and the others are still ended.

    Raises: StorageUnavailable or SQLAlchemyError (the database is unavailable; the next
    pass tries again),
    VersionConflict (a run moved meanwhile: that host's transaction rolled back whole).
    """
    with UnitOfWork(engine, write=False) as uow:
        now = db_now_ms(uow.conn)
        expired = uow.conn.execute(
            select(_L.slot, _L.epoch)
            .where(_L.slot != me_slot, _L.released_at_ms.is_(None), _L.expires_at_ms <= now)
            .order_by(_L.expires_at_ms)
        ).all()
    done = []
    for slot, epoch in expired:
        try:
            found = _expire_one(engine, slot, epoch, me_instance_id, me_host, limit)
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
                raise
            # That host's rows stay locked by a session of its own: the other vanished
            # hosts are still ended now, this one by a later pass.
            log.warning(
                "a vanished host's rows stayed locked past the expiry's lock timeout (its "
                "session frozen mid-transaction); the next pass tries again"
            )
            continue
        if found is not None:
            done.append(found)
    return done


def _expire_one(
    engine: Engine, slot: str, epoch: int, me_instance_id: str, me_host: str, limit: int
) -> ExpiredHost | None:
    def vanished(row: Row[Any], now: int) -> bool:
        return row.released_at_ms is None and row.expires_at_ms <= now  # else renewed, released

    def facts(row: Row[Any]) -> dict[str, Any]:
        return {
            "expired_at_ms": row.expires_at_ms, "by_instance_id": me_instance_id,
            "by_host": me_host,
        }  # fmt: skip

    ended = _end_page(
        engine, slot, epoch, limit, gone=vanished, code=ErrorCode.WORKER_LEASE_EXPIRED,
        event=WORKER_LEASE_EXPIRED, facts=facts,
    )  # fmt: skip
    return None if ended is None else ExpiredHost(*ended)


def _end_page(
    engine: Engine,
    slot: str,
    epoch: int,
    limit: int,
    *,
    gone: Callable[[Row[Any], int], bool],
    code: ErrorCode,
    event: str,
    facts: Callable[[Row[Any]], dict[str, Any]],
) -> tuple[str, str, int, int, int] | None:
    """One transaction: the lease row of ``slot`` locked, still at ``epoch`` and ``gone`` by
    the database's clock, its epoch bumped and up to ``limit`` of its instance's active
    attempts ended ``lost`` ``code``, with the service event ``event``. None when the row
    moved meanwhile or nothing of it is active (then nothing is written)."""
    with UnitOfWork(engine) as uow:
        conn = uow.conn
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(EXPIRY_LOCK_TIMEOUT)
        now = db_now_ms(conn)
        row = conn.execute(select(worker_leases).where(_L.slot == slot).with_for_update()).first()
        if row is None or row.epoch != epoch or not gone(row, now):
            return None  # renewed, taken again or superseded meanwhile
        page = conn.execute(HOST_ACTIVE_PAGE, {"instance": row.instance_id, "limit": limit}).all()
        if not page:
            return None  # nothing of it is active: the row stays as it is
        conn.execute(update(worker_leases).where(_L.slot == slot).values(epoch=epoch + 1))
        for attempt_id, run_id in page:
            lose_in(conn, run_id=run_id, attempt_id=attempt_id, code=code, at=now)
        append_service_event(conn, event, now, {
            "instance_id": row.instance_id, "host": row.host, "old_epoch": epoch,
            "new_epoch": epoch + 1, "attempts_lost": len(page), **facts(row),
        })  # fmt: skip
        uow.commit()
    return row.instance_id, row.host, epoch, epoch + 1, len(page)


@dataclass(frozen=True, slots=True)
class Retired:
    """What ``retire_host`` found: ``state`` is ``unknown`` (no lease of that instance),
    ``held`` (its worker holds it: refused), or ``retired`` with how many attempts it
    ended ``lost`` (0: none was active) and the epoch the lease has now."""

    state: str
    host: str = ""
    attempts_lost: int = 0
    epoch: int = 0
    expires_at_ms: int = 0


def retire_host(
    engine: Engine, *, slot: str, instance_id: str, by_host: str, limit: int
) -> Retired:
    """An operator's word that ``instance_id``'s host is gone for good (docs/several-hosts.md
    §4, "A host stopped for good"): its lease released by an orderly stop, or expired, its
    active attempts end ``lost`` ``WORKER_RETIRED`` page by page, each page as an expiry's
    (epoch bumped, ``worker.retired`` service event), so that worker, should it start
    again, settles its journal against them. A lease its worker holds is refused.

    Raises: StorageUnavailable or SQLAlchemyError, VersionConflict (a run moved meanwhile:
    that page rolled back whole; the command may be given again).
    """

    def stopped(row: Row[Any], now: int) -> bool:
        return row.released_at_ms is not None or row.expires_at_ms <= now

    lost = 0
    while True:
        with UnitOfWork(engine, write=False) as uow:
            now = db_now_ms(uow.conn)
            row = uow.conn.execute(select(worker_leases).where(_L.slot == slot)).first()
        if row is None or row.instance_id != instance_id:
            return Retired("unknown", attempts_lost=lost)
        if not stopped(row, now):
            return Retired("held", row.host, lost, row.epoch, row.expires_at_ms)
        ended = _end_page(
            engine, slot, row.epoch, limit, gone=stopped, code=ErrorCode.WORKER_RETIRED,
            event=WORKER_RETIRED, facts=lambda _row: {"by_host": by_host},
        )  # fmt: skip
        if ended is None:
            with UnitOfWork(engine) as uow:
                again = uow.conn.execute(  # locked: a worker taking it back waits
                    select(_L.epoch).where(_L.slot == slot).with_for_update()
                ).scalar()
                if again != row.epoch:
                    continue  # the row moved meanwhile: read it again
                # Nothing (left) active: done. Its last sweep's row goes too, or the host
                # would read for good as one whose sweeps stopped (GET /system/storage).
                uow.conn.execute(
                    delete(retention_sweeps).where(retention_sweeps.c.sweeper == instance_id)
                )
                uow.commit()
            return Retired("retired", row.host, lost, row.epoch)
        lost += ended[4]
