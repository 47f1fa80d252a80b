"""The worker lease (docs/worker-lease.md, docs/several-hosts.md): who may run a worker.

A worker holds a lease row, renews it on a cadence, and every change of holder bumps the
epoch. On SQLite one row guards the whole database (one worker, one host); on PostgreSQL
every instance (data dir, so every host) has its own row, and a second worker of the same
instance is refused. This module decides, from the row as read, whether a claimant may take
it; the storage adapter applies the decision as one compare-and-set on the epoch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

WORKER_LEASE_ACQUIRED = "worker.lease_acquired"
WORKER_LEASE_TAKEN_OVER = "worker.lease_taken_over"
WORKER_LEASE_RELEASED = "worker.lease_released"
# Another host's lease expired with attempts still active: a live worker superseded its
# epoch and ended those attempts lost WORKER_LEASE_EXPIRED (docs/several-hosts.md §4).
WORKER_LEASE_EXPIRED = "worker.lease_expired"
# An operator said a host is gone for good (``qinglong lease retire``): its stopped lease's
# epoch moved and its attempts still active ended lost WORKER_RETIRED (docs/several-hosts.md
# §4).
WORKER_RETIRED = "worker.retired"
SERVICE_EVENT_TYPES = frozenset(
    {
        WORKER_LEASE_ACQUIRED, WORKER_LEASE_TAKEN_OVER, WORKER_LEASE_RELEASED,
        WORKER_LEASE_EXPIRED, WORKER_RETIRED,
    }
)  # fmt: skip


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
    # The holder host's api as other hosts reach it (log reads), if it advertised one.
    base_url: str | None = None

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
