"""The worker lease rows and the service event history (docs/worker-lease.md).

On SQLite there is one row (slot ``worker``) for the whole database; on PostgreSQL every
instance has its own row, its slot being its instance id's hex digits (docs/several-hosts.md), so
several hosts hold leases at once while a second worker of one instance is still refused.

Every write is one transaction whose UPDATE re-checks what the decision was based on (the
epoch, and the expiry or the release it relied on): two takers racing for one lease both
read the same row, and the database lets exactly one UPDATE (or the first INSERT) through.
On PostgreSQL (READ COMMITTED) a waiting UPDATE re-evaluates its WHERE clause on the newest
row version; on SQLite writers are serialized by ``BEGIN IMMEDIATE``. Times come from the
database's clock, so hosts whose clocks disagree still agree on when a lease expires.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Row,
    bindparam,
    insert,
    literal_column,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError

from app.domain.canonical import canonical_json
from app.domain.errors import LeaseHeld, LeaseLost
from app.domain.ids import now_ms, uuid7
from app.domain.lease import (
    WORKER_LEASE_ACQUIRED,
    WORKER_LEASE_EXPIRED,
    WORKER_LEASE_RELEASED,
    WORKER_LEASE_TAKEN_OVER,
    WORKER_RETIRED,
    Claimant,
    Lease,
    Take,
    decide,
)
from app.storage.tables import service_events, worker_leases
from app.storage.uow import UnitOfWork

SLOT = "worker"  # SQLite: one lease per database (one host)
# Each retry means another taker committed first; the next read then sees its live lease.
_TAKE_TRIES = 5
_PG_NOW_MS = text("SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)")
_L = worker_leases.c
_FENCE = select(_L.epoch, _L.released_at_ms, _L.expires_at_ms).where(_L.slot == bindparam("slot"))
_FENCE_PG = (
    select(
        _L.epoch,
        _L.released_at_ms,
        _L.expires_at_ms,
        literal_column("CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)").label(
            "now_ms"
        ),
    )
    .where(_L.slot == bindparam("slot"))
    .with_for_update(read=True)
)


@dataclass(frozen=True, slots=True)
class Superseded:
    """Another host ended an expired lease's attempts, or an operator retired a stopped one
    (``retired``): the epoch its holder had, that host, and how many attempts it ended
    ``lost``."""

    held_epoch: int
    by_host: str
    attempts_lost: int
    retired: bool = False


_SUPERSEDED_SCAN = 500  # expiry events read, newest first: enough for any one host's pages


@dataclass(frozen=True, slots=True)
class ServiceEvent:
    """One entry of the service history (content-free facts only)."""

    id: str
    type: str
    at_ms: int
    data: dict[str, Any]


def db_now_ms(conn: Connection) -> int:
    """The database's clock (PostgreSQL); SQLite lives on this host, so this host's clock."""
    if conn.dialect.name == "postgresql":
        return int(conn.execute(_PG_NOW_MS).scalar_one())
    return now_ms()


def _lease(row: Row[Any]) -> Lease:
    return Lease(
        instance_id=row.instance_id,
        host=row.host,
        boot_id=row.boot_id,
        pid=row.pid,
        start_ticks=row.start_ticks,
        epoch=row.epoch,
        acquired_at_ms=row.acquired_at_ms,
        renewed_at_ms=row.renewed_at_ms,
        expires_at_ms=row.expires_at_ms,
        released_at_ms=row.released_at_ms,
        base_url=row.base_url,
    )


def _read(conn: Connection, slot: str) -> Lease | None:
    row = conn.execute(select(worker_leases).where(_L.slot == slot)).first()
    return None if row is None else _lease(row)


def several_hosts(engine_or_conn: Engine | Connection) -> bool:
    """PostgreSQL: one lease per instance, several hosts; SQLite: one lease, one host."""
    return engine_or_conn.dialect.name == "postgresql"


def lease_current_in(conn: Connection, *, slot: str, epoch: int) -> bool:
    """Inside the caller's transaction: the lease in ``slot`` is still at ``epoch``, not
    released and not expired by the database's clock (the completion fence).

    On PostgreSQL the row is read FOR SHARE: a concurrent supersede (another host ending
    this host's attempts, docs/several-hosts.md §4) either committed before (then this
    answers False) or waits until the caller's transaction ends.
    """
    pg = conn.dialect.name == "postgresql"
    row = conn.execute(_FENCE_PG if pg else _FENCE, {"slot": slot}).first()
    if row is None:
        return False
    # On PostgreSQL the database's clock comes with the row: one round trip per completion.
    now = row.now_ms if pg else now_ms()
    return row.epoch == epoch and row.released_at_ms is None and now < row.expires_at_ms


def append_service_event(conn: Connection, kind: str, at_ms: int, data: dict[str, Any]) -> None:
    conn.execute(
        insert(service_events).values(
            id=uuid7(), type=kind, at_ms=at_ms, data=canonical_json(data).decode("utf-8")
        )
    )


def _take_event(kind: Take, old: Lease | None, new: Lease) -> tuple[str, dict[str, Any]]:
    mine = {"instance_id": new.instance_id, "host": new.host, "epoch": new.epoch}
    if old is None or kind is Take.RESTART:
        previous = None if old is None else old.epoch
        return WORKER_LEASE_ACQUIRED, mine | {"reason": kind.value, "previous_epoch": previous}
    return WORKER_LEASE_TAKEN_OVER, {
        "reason": kind.value,
        "old_instance_id": old.instance_id,
        "old_host": old.host,
        "old_epoch": old.epoch,
        "old_expires_at_ms": old.expires_at_ms,
        "new_instance_id": new.instance_id,
        "new_host": new.host,
        "new_epoch": new.epoch,
    }


class LeaseRepository:
    """Take, renew and release the worker lease; read it and the service history."""

    def __init__(self, engine: Engine, *, single_slot: bool | None = None) -> None:
        self._engine = engine
        self.engine = engine
        # SQLite's one lease for the database; PostgreSQL: one per instance (tests may
        # force the single slot on PostgreSQL to exercise the same guard there).
        self.single_slot = not several_hosts(engine) if single_slot is None else single_slot

    def slot_of(self, instance_id: str) -> str:
        """The row an instance's worker holds (the id's 32 hex digits fit the slot column)."""
        return SLOT if self.single_slot else instance_id.replace("-", "")

    def take(
        self,
        *,
        claimant: Claimant,
        ttl_ms: int,
        holder_alive: Callable[[Lease], bool],
        base_url: str | None = None,
    ) -> Lease:
        """Take the lease for ``claimant`` (epoch + 1) and record it in the history.

        ``holder_alive`` says whether the holder's process still runs on this boot; it
        matters only for the claimant's own instance (see ``decide``).

        Raises: LeaseHeld (a live worker holds it).
        """
        for _ in range(_TAKE_TRIES):
            try:
                with UnitOfWork(self._engine) as uow:
                    taken = self._try_take(uow.conn, claimant, ttl_ms, holder_alive, base_url)
                    if taken is not None:
                        uow.commit()
                        return taken
            except IntegrityError:
                pass  # a concurrent first taker inserted the row: read it again
        with UnitOfWork(self._engine, write=False) as uow:
            current = _read(uow.conn, self.slot_of(claimant.instance_id))
        assert current is not None  # every retry follows somebody else's committed take
        raise self._held(current, claimant)

    def _held(self, holder: Lease, me: Claimant) -> LeaseHeld:
        return LeaseHeld(
            holder, single_host=self.single_slot and holder.instance_id != me.instance_id
        )

    def _try_take(
        self,
        conn: Connection,
        me: Claimant,
        ttl_ms: int,
        holder_alive: Callable[[Lease], bool],
        base_url: str | None,
    ) -> Lease | None:
        """The taken lease, or None when a concurrent taker won (nothing written)."""
        slot = self.slot_of(me.instance_id)
        now = db_now_ms(conn)
        old = _read(conn, slot)
        alive = old is not None and holder_alive(old)
        kind = decide(old, me, now_ms=now, holder_alive=alive)
        if kind is Take.HELD:
            assert old is not None
            raise self._held(old, me)
        new = Lease(
            instance_id=me.instance_id, host=me.host, boot_id=me.boot_id, pid=me.pid,
            start_ticks=me.start_ticks, epoch=1 if old is None else old.epoch + 1,
            acquired_at_ms=now, renewed_at_ms=now, expires_at_ms=now + ttl_ms,
            released_at_ms=None, base_url=base_url,
        )  # fmt: skip
        values = asdict(new)
        if old is None:
            conn.execute(insert(worker_leases).values(slot=slot, **values))
        else:
            fence = [_L.slot == slot, _L.epoch == old.epoch]
            if kind is Take.EXPIRED:  # a renewal that committed meanwhile keeps it held
                fence += [_L.released_at_ms.is_(None), _L.expires_at_ms <= now]
            if conn.execute(update(worker_leases).where(*fence).values(**values)).rowcount != 1:
                return None
        event, data = _take_event(kind, old, new)
        append_service_event(conn, event, now, data)
        return new

    def renew(self, *, instance_id: str, epoch: int, ttl_ms: int) -> Lease:
        """Push the expiry of a lease still held (same epoch, not released, not expired).

        Raises: LeaseLost (taken over, released, or expired before this renewal).
        """
        slot = self.slot_of(instance_id)
        with UnitOfWork(self._engine) as uow:
            now = db_now_ms(uow.conn)
            held = [
                _L.slot == slot, _L.instance_id == instance_id, _L.epoch == epoch,
                _L.released_at_ms.is_(None), _L.expires_at_ms > now,
            ]  # fmt: skip
            stmt = update(worker_leases).where(*held)
            result = uow.conn.execute(stmt.values(renewed_at_ms=now, expires_at_ms=now + ttl_ms))
            current = _read(uow.conn, slot)
            if result.rowcount != 1 or current is None:
                raise LeaseLost(epoch=epoch, holder=current, instance_id=instance_id)
            uow.commit()
        return current

    def release(self, *, instance_id: str, epoch: int) -> bool:
        """Release a lease still held so another instance may take it at once; False if not."""
        with UnitOfWork(self._engine) as uow:
            now = db_now_ms(uow.conn)
            held = [
                _L.slot == self.slot_of(instance_id), _L.instance_id == instance_id,
                _L.epoch == epoch,
            ]  # fmt: skip
            stmt = update(worker_leases).where(*held, _L.released_at_ms.is_(None))
            if uow.conn.execute(stmt.values(released_at_ms=now)).rowcount != 1:
                return False
            facts = {"instance_id": instance_id, "epoch": epoch}
            append_service_event(uow.conn, WORKER_LEASE_RELEASED, now, facts)
            uow.commit()
        return True

    def current(self, instance_id: str | None = None) -> Lease | None:
        """The lease row as it is now (held, released or expired), or None: SQLite's one
        row, or on PostgreSQL the row of ``instance_id``."""
        slot = SLOT if instance_id is None else self.slot_of(instance_id)
        with UnitOfWork(self._engine, write=False) as uow:
            return _read(uow.conn, slot)

    def leases(self) -> list[Lease]:
        """Every lease row (one per instance that ever ran a worker; bounded by hosts)."""
        with UnitOfWork(self._engine, write=False) as uow:
            rows = uow.conn.execute(select(worker_leases).order_by(_L.acquired_at_ms)).all()
        return [_lease(r) for r in rows]

    def superseded(self, instance_id: str, epoch: int) -> Superseded | None:
        """How another host moved ``instance_id``'s expired lease to ``epoch`` by ending its
        attempts ``lost``, or an operator's ``lease retire`` did (docs/several-hosts.md §4),
        from the newest such events; None when neither did."""
        query = (
            select(service_events.c.type, service_events.c.data)
            .where(service_events.c.type.in_([WORKER_LEASE_EXPIRED, WORKER_RETIRED]))
            .order_by(service_events.c.id.desc())
            .limit(_SUPERSEDED_SCAN)
        )
        with UnitOfWork(self._engine, write=False) as uow:
            found = [(r.type, json.loads(r.data)) for r in uow.conn.execute(query)]
        chain = [(t, d) for t, d in found if d.get("instance_id") == instance_id]
        held, by_host, lost, retired = epoch, None, 0, False
        for kind, facts in chain:  # newest first: each page of a pass moved the epoch by one
            if facts.get("new_epoch") != held:
                continue
            held, lost = int(facts["old_epoch"]), lost + int(facts.get("attempts_lost", 0))
            by_host = by_host or str(facts.get("by_host", "?"))
            retired = retired or kind == WORKER_RETIRED
        return None if by_host is None else Superseded(held, by_host, lost, retired)

    def history(self, *, limit: int) -> list[ServiceEvent]:
        """The newest ``limit`` service events, oldest first."""
        query = select(service_events).order_by(service_events.c.id.desc()).limit(limit)
        with UnitOfWork(self._engine, write=False) as uow:
            rows = uow.conn.execute(query).all()
        return [
            ServiceEvent(id=r.id, type=r.type, at_ms=r.at_ms, data=json.loads(r.data))
            for r in reversed(rows)
        ]
