"""Each host's last retention sweep (migration 0013, docs/retention.md §5): with several
hosts one row each, so a host whose sweeps stopped is seen; one host keeps the row ``logs``;
a downgrade leaves the older build its one row."""

from __future__ import annotations

from alembic import command
from sqlalchemy import Engine, select

from app.storage.hosts_repo import retire_host
from app.storage.lease_repo import LeaseRepository
from app.storage.migrate import upgrade_to_head
from app.storage.retention_repo import RetentionRepository, SweepRecord
from app.storage.tables import retention_sweeps
from tests.storage.test_upgrade_from_0004 import empty_engine, migrate_to
from tests.storage.test_worker_lease import TTL_MS, alive, claimant

__all__ = ["empty_engine"]  # the fixture, on a fresh SQLite file or a private PG schema


def _sweep(at_ms: int, expired: int) -> SweepRecord:
    return SweepRecord(
        at_ms=at_ms, duration_ms=5, expired_logs=expired, finished_expiring=0, deleted_runs=0,
        freed_bytes=expired * 10, log_bytes=100, free_bytes=None,
    )  # fmt: skip


def test_each_host_keeps_its_own_last_sweep_and_a_stopped_one_shows_as_the_oldest(
    empty_engine: Engine,
) -> None:
    """Before 0013 every host overwrote one row: the newest pass of whichever host swept
    last, with no word of which host, so a host whose sweeps had stopped was hidden."""
    engine = empty_engine
    upgrade_to_head(engine)
    RetentionRepository(engine).record_sweep(_sweep(1_000, 1))  # a single host, or older build
    assert [(s.instance_id, s.expired_logs) for s in RetentionRepository(engine).figures().sweeps] == [
        (None, 1)
    ]
    a, b = claimant(host="host-a"), claimant(host="host-b")
    leases = LeaseRepository(engine, single_slot=False)
    for who in (a, b):
        leases.take(claimant=who, ttl_ms=TTL_MS, holder_alive=alive)
    RetentionRepository(engine, worker_instance_id=a.instance_id).record_sweep(_sweep(2_000, 2))
    RetentionRepository(engine, worker_instance_id=b.instance_id).record_sweep(_sweep(3_000, 3))
    RetentionRepository(engine, worker_instance_id=b.instance_id).record_sweep(_sweep(4_000, 4))
    figures = RetentionRepository(engine).figures()
    # b swept last; a's sweep stopped at 2,000 and still shows; the host-less row is gone.
    assert [(s.host, s.instance_id, s.at_ms, s.expired_logs) for s in figures.sweeps] == [
        ("host-b", b.instance_id, 4_000, 4), ("host-a", a.instance_id, 2_000, 2),
    ]  # fmt: skip
    assert figures.last_sweep == figures.sweeps[0]

    migrate_to(engine, "0012", command.downgrade)  # the older build reads the row ``logs``
    with engine.connect() as conn:
        rows = conn.execute(select(retention_sweeps.c.sweeper, retention_sweeps.c.at_ms)).all()
    assert [tuple(r) for r in rows] == [("logs", 4_000)]
    upgrade_to_head(engine)
    assert [s.at_ms for s in RetentionRepository(engine).figures().sweeps] == [4_000]


def test_an_instance_with_an_old_single_slot_lease_row_is_one_sweep_and_a_retired_one_none(
    empty_engine: Engine,
) -> None:
    """An installation from before migration 0008 keeps its single-slot lease row beside
    the instance's own (same instance id): the host was joined twice, so its sweep was
    listed twice. A host retired for good (`lease retire`) leaves no sweep behind, or it
    would read for good as one whose sweeps stopped."""
    engine = empty_engine
    upgrade_to_head(engine)
    a = claimant(host="host-a")
    old = LeaseRepository(engine, single_slot=True).take(claimant=a, ttl_ms=TTL_MS, holder_alive=alive)
    LeaseRepository(engine, single_slot=True).release(instance_id=a.instance_id, epoch=old.epoch)
    leases = LeaseRepository(engine, single_slot=False)
    lease = leases.take(claimant=a, ttl_ms=TTL_MS, holder_alive=alive)
    RetentionRepository(engine, worker_instance_id=a.instance_id).record_sweep(_sweep(2_000, 2))
    assert [(s.host, s.at_ms) for s in RetentionRepository(engine).figures().sweeps] == [
        ("host-a", 2_000)
    ]
    assert leases.release(instance_id=a.instance_id, epoch=lease.epoch)
    done = retire_host(engine, slot=leases.slot_of(a.instance_id), instance_id=a.instance_id,
                       by_host="ops", limit=64)  # fmt: skip
    assert done.state == "retired"
    assert RetentionRepository(engine).figures().sweeps == []
