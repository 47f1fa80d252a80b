"""The worker lease (docs/worker-lease.md): who may run the worker on one database.

Until several execution hosts are supported, one worker at a time owns a database: it holds
the lease row, renews it on a cadence, and every change of holder bumps the epoch. This
module decides, from the row as read, whether a claimant may take the lease; the storage
adapter applies the decision as one compare-and-set on the epoch.
"""

from __future__ import annotations

import datetime
import enum
from dataclasses import dataclass

from app.domain.errors import DomainError, ErrorCode

WORKER_LEASE_ACQUIRED = "worker.lease_acquired"
WORKER_LEASE_TAKEN_OVER = "worker.lease_taken_over"
WORKER_LEASE_RELEASED = "worker.lease_released"
SERVICE_EVENT_TYPES = frozenset(
    {WORKER_LEASE_ACQUIRED, WORKER_LEASE_TAKEN_OVER, WORKER_LEASE_RELEASED}
)


@dataclass(frozen=True, slots=True)
class Claimant:
    """A worker asking for the lease: its instance (data dir) and its process."""

    instance_id: str
    host: str
    boot_id: str
    pid: int
    start_ticks: int


@dataclass(frozen=True, slots=True)
class Lease:
    """The lease row. Times are the database's clock, in ms since the epoch."""

    instance_id: str
    host: str
    boot_id: str
    pid: int
    start_ticks: int
    epoch: int
    acquired_at_ms: int
    renewed_at_ms: int
    expires_at_ms: int
    released_at_ms: int | None

    def live(self, now_ms: int) -> bool:
        """Held: not released and not yet expired."""
        return self.released_at_ms is None and now_ms < self.expires_at_ms


class Take(enum.Enum):
    """How a claimant may get the lease, or that it may not."""

    NEW = "new"  # no lease row yet
    RESTART = "restart"  # the same instance again: its previous worker is gone
    RELEASED = "released"  # another instance stopped in order and released it
    EXPIRED = "expired"  # another instance stopped renewing (its host is gone)
    HELD = "held"  # a live worker holds it: refuse


def decide(current: Lease | None, me: Claimant, *, now_ms: int, holder_alive: bool) -> Take:
    """What ``me`` may do with ``current``; ``holder_alive``: its process runs on this boot.

    The same instance re-takes its own lease at once when its previous worker is gone
    (a supervisor restart, a kill -9), but never from a worker that still runs on this
    data dir. Another instance waits for a release or for the expiry.
    """
    if current is None:
        return Take.NEW
    if current.instance_id == me.instance_id:
        if not holder_alive or not current.live(now_ms):
            return Take.RESTART
        return Take.HELD
    if current.released_at_ms is not None:
        return Take.RELEASED
    if now_ms >= current.expires_at_ms:
        return Take.EXPIRED
    return Take.HELD


def _utc(ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class LeaseHeld(DomainError):
    """Another live worker holds the lease: this one must not start (one line to print)."""

    def __init__(self, holder: Lease) -> None:
        super().__init__(
            ErrorCode.WORKER_LEASE_HELD,
            f"the worker lease on this database is held by instance {holder.instance_id} on "
            f"host {holder.host} (pid {holder.pid}, epoch {holder.epoch}) since "
            f"{_utc(holder.acquired_at_ms)}, expiring {_utc(holder.expires_at_ms)} unless "
            "renewed; to take over, stop that worker (an orderly stop releases the lease), "
            "or, if its host is gone, start this one again after the expiry",
        )
        self.holder = holder


class LeaseLost(DomainError):
    """This worker no longer holds the lease: it stops serving (fail closed)."""

    def __init__(self, *, epoch: int, holder: Lease | None) -> None:
        if holder is None or holder.epoch == epoch:
            taken = "could not be renewed before it expired"
        else:
            taken = (
                f"was taken over by instance {holder.instance_id} on host {holder.host} "
                f"(epoch {holder.epoch})"
            )
        super().__init__(
            ErrorCode.WORKER_LEASE_LOST,
            f"the worker lease (epoch {epoch}) {taken}; this worker stops serving",
        )
        self.epoch = epoch
        self.holder = holder
