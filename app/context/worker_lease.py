"""The worker's hold on its lease (docs/worker-lease.md): take it, renew it, let it go.

The worker takes the lease before anything that touches runs; a thread renews it every
``lease_renew_s``. The lease is lost when a renewal finds another epoch, or when no renewal
succeeded within one TTL of the last good one (measured on CLOCK_BOOTTIME, which counts time
spent stopped or suspended too, so a worker that was stopped or cut off from the database
for a TTL never assumes it still holds the lease). Then the keeper logs one line and calls
``on_lost`` once: the worker stops serving (fail closed) and exits with
``EXIT_LEASE_LOST``. Until it has stopped, the launcher it gates refuses every launch once
the lease is no longer surely held. An orderly shutdown releases the lease, so another
instance may take it at once; a worker that dies leaves it to expire.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from app.domain.errors import DomainError, LaunchFailed, LeaseLost, StorageUnavailable
from app.domain.execution import Launched, LaunchRequest
from app.domain.lease import Lease
from app.failure_log import FailureLog
from app.settings import Settings
from app.storage.hosts_repo import HOST_PAGE, expire_vanished_hosts
from app.storage.lease_repo import LeaseRepository
from app.worker.instance import claimant, holder_alive
from app.worker.server import WorkerLauncher

log = logging.getLogger(__name__)

# ``qinglong worker`` exit statuses. HELD is fatal to ``qinglong serve`` (restarting cannot
# help while another worker holds the lease); after LOST a restart either re-takes the
# lease (nobody else took it) or is refused with HELD.
EXIT_LEASE_HELD = 75
EXIT_LEASE_LOST = 76
_JOIN_S = 5.0
# Attempts of one vanished host ended per renewal (the next renewal takes the next page).
EXPIRE_PAGE = HOST_PAGE
# How long a lost lease's line waits to name who holds the lease now.
HOLDER_READ_S = 1.0


def _clock() -> float:
    """Seconds on CLOCK_BOOTTIME: unlike CLOCK_MONOTONIC it runs on while the host sleeps,
    as the lease's expiry does in the database."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class LeaseKeeper:
    """Holds the worker lease taken by ``take``; renews it on its own thread."""

    def __init__(
        self,
        *,
        repo: LeaseRepository,
        lease: Lease,
        valid_until: float,
        settings: Settings,
        on_lost: Callable[[], None],
    ) -> None:
        self._repo = repo
        self.lease = lease
        self._valid_until = valid_until  # _clock(): no renewal succeeded after this → lost
        self._ttl_s = settings.lease_ttl_s
        # A launch must finish well before the database could let another worker take over.
        self._margin_s = settings.lease_ttl_s / 10
        self._renew_s = settings.lease_renew_s
        self._on_lost = on_lost
        # The pass runs after every renewal: failing, one line each time was 360 an hour.
        self._vanished_failures = FailureLog(log, "vanished-host pass", level=logging.WARNING)
        self._stop = threading.Event()
        self._lost = False
        self._thread = threading.Thread(target=self._run, name="ql-lease", daemon=True)

    @classmethod
    def take(
        cls, *, settings: Settings, engine: Engine, on_lost: Callable[[], None]
    ) -> LeaseKeeper:
        """Take the lease and start renewing it.

        Raises: LeaseHeld (another live worker holds it).
        """
        repo = LeaseRepository(engine)
        started = _clock()
        lease = repo.take(
            claimant=claimant(settings.data_dir),
            ttl_ms=round(settings.lease_ttl_s * 1000),
            holder_alive=holder_alive,
            base_url=settings.advertise_url,
        )
        keeper = cls(
            repo=repo,
            lease=lease,
            valid_until=started + settings.lease_ttl_s,
            settings=settings,
            on_lost=on_lost,
        )
        log.info("worker lease taken: instance %s, epoch %d", lease.instance_id, lease.epoch)
        keeper._thread.start()
        return keeper

    @property
    def lost(self) -> bool:
        """The lease was lost while this worker ran."""
        return self._lost

    @property
    def fence(self) -> tuple[str, int]:
        """(slot, epoch) of the lease this worker holds: what its completions carry."""
        return self._repo.slot_of(self.lease.instance_id), self.lease.epoch

    def ping_facts(self) -> dict[str, object] | None:
        """What ``ping`` tells the api: instance and epoch, or None when not surely held."""
        if not self.held():
            return None
        return {"instance_id": self.lease.instance_id, "epoch": self.lease.epoch}

    def held(self) -> bool:
        """Surely still ours: not lost, and the last renewal is recent enough to act on."""
        return not self._lost and _clock() < self._valid_until - self._margin_s

    def gate(self, launcher: WorkerLauncher) -> WorkerLauncher:
        """``launcher``, refusing every launch once ``held()`` is false (fail closed)."""
        return _GatedLauncher(launcher, self)

    def _run(self) -> None:
        while True:
            wait = min(self._renew_s, self._valid_until - _clock())
            if self._stop.wait(max(wait, 0.0)):
                return
            started = _clock()
            if started >= self._valid_until:
                holder = self._holder_now()
                self._lose(
                    LeaseLost(
                        epoch=self.lease.epoch, holder=holder, instance_id=self.lease.instance_id
                    )
                )
                return
            try:
                self.lease = self._repo.renew(
                    instance_id=self.lease.instance_id,
                    epoch=self.lease.epoch,
                    ttl_ms=round(self._ttl_s * 1000),
                )
            except LeaseLost as exc:
                self._lose(exc)
                return
            except (SQLAlchemyError, StorageUnavailable) as exc:  # again until the TTL runs out
                # StorageUnavailable: a full disk or a read-only database refused the commit;
                # the renewal succeeds again once space returns.
                log.warning("worker lease renewal failed (%s); retrying", type(exc).__name__)
                continue
            self._valid_until = started + self._ttl_s
            if not self._repo.single_slot:
                self._expire_vanished()

    def _expire_vanished(self) -> None:
        """Several hosts: end the attempts of hosts whose lease expired (several-hosts.md §4)."""
        me = self.lease
        try:
            ended = expire_vanished_hosts(
                self._repo.engine, me_slot=self._repo.slot_of(me.instance_id),
                me_instance_id=me.instance_id, me_host=me.host, limit=EXPIRE_PAGE,
            )  # fmt: skip
        except (SQLAlchemyError, DomainError, StorageUnavailable) as exc:  # next renewal retries
            self._vanished_failures.failed(exc)
            return
        self._vanished_failures.succeeded()
        for host in ended:
            log.warning(
                "the worker lease of host %s (instance %s, epoch %d) expired: %d of its "
                "attempts ended lost WORKER_LEASE_EXPIRED; its epoch is now %d",
                host.host, host.instance_id, host.old_epoch, host.lost, host.new_epoch,
            )  # fmt: skip

    def _holder_now(self) -> Lease | None:
        """Who holds the lease now, to say so in the one line (None if unreadable, or not
        read within ``HOLDER_READ_S``). The read runs on a thread of its own, left to end
        on its own if late: behind a silent partition it waits for the connection's bounds
        (a connect timeout or more), and the worker must not wait that long to stop."""
        got: list[Lease | None] = []

        def read() -> None:
            try:
                got.append(self._repo.current(self.lease.instance_id))
            except (SQLAlchemyError, StorageUnavailable):
                got.append(None)

        reader = threading.Thread(target=read, name="ql-lease-holder", daemon=True)
        reader.start()
        reader.join(HOLDER_READ_S)
        return got[0] if got else None

    def _lose(self, exc: LeaseLost) -> None:
        self._lost = True
        log.error("%s", exc.detail)
        self._on_lost()

    def release(self) -> None:
        """Stop renewing; release the lease unless it was lost (then it is not ours)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(_JOIN_S)
        if self._lost:
            return
        try:
            released = self._repo.release(
                instance_id=self.lease.instance_id, epoch=self.lease.epoch
            )
        except (SQLAlchemyError, StorageUnavailable) as exc:
            log.warning("worker lease not released (%s); it expires", type(exc).__name__)
            return
        if released:
            log.info("worker lease released (epoch %d)", self.lease.epoch)


class _GatedLauncher:
    """Launches only while the lease is surely held; nothing is spawned otherwise."""

    def __init__(self, launcher: WorkerLauncher, keeper: LeaseKeeper) -> None:
        self._launcher = launcher
        self._keeper = keeper

    def launch_started(self, request: LaunchRequest, *, t2: bool = False) -> Launched:
        """Refuse with ``WORKER_LEASE_LOST`` before any file or process exists."""
        if not self._keeper.held():
            raise LaunchFailed("WORKER_LEASE_LOST")
        return self._launcher.launch_started(request, t2=t2)
