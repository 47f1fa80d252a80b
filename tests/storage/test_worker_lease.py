"""The worker lease on both engines: take, renew, refuse, re-take, expired takeover, races."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import Engine, update

from app.domain.errors import LeaseHeld, LeaseLost
from app.domain.ids import uuid7
from app.domain.lease import Claimant, Lease
from app.storage.lease_repo import LeaseRepository
from app.storage.tables import worker_leases

TTL_MS = 30_000
SHORT_TTL_MS = 1_500  # long enough that a loaded CI box commits well inside it


def claimant(instance_id: str | None = None, *, host: str = "host-a", pid: int = 100) -> Claimant:
    """A claimant with a fresh (or the given) instance id."""
    return Claimant(
        instance_id=instance_id or uuid7(), host=host, boot_id="boot-1", pid=pid, start_ticks=7
    )


def dead(_lease: Lease) -> bool:
    """The holder's process is gone (a kill -9, a supervisor restart)."""
    return False


def alive(_lease: Lease) -> bool:
    """The holder's process still runs here."""
    return True


def test_first_take_creates_epoch_one_and_records_it(engine: Engine) -> None:
    repo = LeaseRepository(engine, single_slot=True)
    me = claimant()
    lease = repo.take(claimant=me, ttl_ms=TTL_MS, holder_alive=alive)
    assert (lease.instance_id, lease.host, lease.pid, lease.epoch) == (
        me.instance_id,
        "host-a",
        100,
        1,
    )
    assert lease.expires_at_ms - lease.acquired_at_ms == TTL_MS
    assert repo.current() == lease
    [event] = repo.history(limit=10)
    assert event.type == "worker.lease_acquired"
    assert event.data == {
        "instance_id": me.instance_id, "host": "host-a", "epoch": 1, "reason": "new",
        "previous_epoch": None,
    }  # fmt: skip


def test_renew_pushes_the_expiry_and_keeps_the_epoch(engine: Engine) -> None:
    repo = LeaseRepository(engine, single_slot=True)
    lease = repo.take(claimant=claimant(), ttl_ms=TTL_MS, holder_alive=alive)
    time.sleep(0.01)
    renewed = repo.renew(instance_id=lease.instance_id, epoch=lease.epoch, ttl_ms=TTL_MS)
    assert renewed.epoch == lease.epoch
    assert renewed.expires_at_ms > lease.expires_at_ms
    assert renewed.acquired_at_ms == lease.acquired_at_ms
    assert len(repo.history(limit=10)) == 1  # a renewal is not news


def test_another_instance_is_refused_while_the_lease_is_live(engine: Engine) -> None:
    repo = LeaseRepository(engine, single_slot=True)
    first = repo.take(claimant=claimant(host="host-a", pid=4242), ttl_ms=TTL_MS, holder_alive=alive)
    with pytest.raises(LeaseHeld) as refused:
        repo.take(claimant=claimant(host="host-b"), ttl_ms=TTL_MS, holder_alive=dead)
    assert refused.value.holder == first
    line = refused.value.detail
    assert "\n" not in line
    for fact in (first.instance_id, "host host-a", "pid 4242", "epoch 1", "since", "expiring"):
        assert fact in line
    assert "stop that worker" in line and "after the expiry" in line
    assert repo.current() == first
    assert len(repo.history(limit=10)) == 1


def test_the_same_instance_re_takes_at_once_when_its_worker_is_gone(engine: Engine) -> None:
    repo = LeaseRepository(engine, single_slot=True)
    me = claimant()
    first = repo.take(claimant=me, ttl_ms=TTL_MS, holder_alive=alive)
    again = repo.take(claimant=claimant(me.instance_id, pid=101), ttl_ms=TTL_MS, holder_alive=dead)
    assert (again.epoch, again.pid) == (first.epoch + 1, 101)
    assert again.acquired_at_ms >= first.acquired_at_ms
    event = repo.history(limit=10)[-1]
    assert event.type == "worker.lease_acquired"
    assert (event.data["reason"], event.data["previous_epoch"], event.data["epoch"]) == (
        "restart",
        1,
        2,
    )
    # The previous worker of this instance, were it still running, has lost its lease.
    with pytest.raises(LeaseLost):
        repo.renew(instance_id=me.instance_id, epoch=first.epoch, ttl_ms=TTL_MS)


def test_the_same_instance_is_refused_while_its_worker_still_runs(engine: Engine) -> None:
    repo = LeaseRepository(engine, single_slot=True)
    me = claimant()
    repo.take(claimant=me, ttl_ms=TTL_MS, holder_alive=alive)
    with pytest.raises(LeaseHeld):
        repo.take(claimant=claimant(me.instance_id, pid=101), ttl_ms=TTL_MS, holder_alive=alive)
    assert repo.current() is not None and repo.current().epoch == 1  # type: ignore[union-attr]


def test_an_expired_lease_is_taken_over_only_after_expiry_and_recorded(engine: Engine) -> None:
    repo = LeaseRepository(engine, single_slot=True)
    old = repo.take(claimant=claimant(host="host-a"), ttl_ms=SHORT_TTL_MS, holder_alive=alive)
    new_me = claimant(host="host-b")
    with pytest.raises(LeaseHeld):  # before the expiry: held, even though nobody renews
        repo.take(claimant=new_me, ttl_ms=TTL_MS, holder_alive=dead)
    time.sleep((old.expires_at_ms - old.acquired_at_ms) / 1000 + 0.05)
    new = repo.take(claimant=new_me, ttl_ms=TTL_MS, holder_alive=dead)
    assert (new.instance_id, new.epoch) == (new_me.instance_id, 2)
    event = repo.history(limit=10)[-1]
    assert event.type == "worker.lease_taken_over"
    assert event.data == {
        "reason": "expired", "old_instance_id": old.instance_id, "old_host": "host-a",
        "old_epoch": 1, "old_expires_at_ms": old.expires_at_ms,
        "new_instance_id": new_me.instance_id, "new_host": "host-b", "new_epoch": 2,
    }  # fmt: skip
    # The old holder, back from a partition, finds the new epoch and is told who has it.
    with pytest.raises(LeaseLost) as lost:
        repo.renew(instance_id=old.instance_id, epoch=old.epoch, ttl_ms=TTL_MS)
    assert lost.value.holder == new
    assert new_me.instance_id in lost.value.detail


def test_a_lease_expired_without_takeover_cannot_be_renewed(engine: Engine) -> None:
    repo = LeaseRepository(engine, single_slot=True)
    old = repo.take(claimant=claimant(), ttl_ms=SHORT_TTL_MS, holder_alive=alive)
    time.sleep(SHORT_TTL_MS / 1000 + 0.05)
    with pytest.raises(LeaseLost) as lost:
        repo.renew(instance_id=old.instance_id, epoch=old.epoch, ttl_ms=TTL_MS)
    assert "could not be renewed before it expired" in lost.value.detail


def test_a_released_lease_is_taken_over_at_once(engine: Engine) -> None:
    repo = LeaseRepository(engine, single_slot=True)
    old = repo.take(claimant=claimant(), ttl_ms=TTL_MS, holder_alive=alive)
    assert repo.release(instance_id=old.instance_id, epoch=old.epoch)
    assert not repo.release(instance_id=old.instance_id, epoch=old.epoch)  # once
    new = repo.take(claimant=claimant(host="host-b"), ttl_ms=TTL_MS, holder_alive=alive)
    assert new.epoch == 2
    types = [(e.type, e.data.get("reason")) for e in repo.history(limit=10)]
    assert types == [
        ("worker.lease_acquired", "new"),
        ("worker.lease_released", None),
        ("worker.lease_taken_over", "released"),
    ]
    # A stale holder cannot release the new holder's lease.
    assert not repo.release(instance_id=old.instance_id, epoch=old.epoch)
    assert repo.current() == new


def _race(repo: LeaseRepository, takers: list[Claimant]) -> tuple[list[Lease], list[LeaseHeld]]:
    barrier = threading.Barrier(len(takers))
    won: list[Lease] = []
    refused: list[LeaseHeld] = []
    lock = threading.Lock()

    def take(me: Claimant) -> None:
        barrier.wait()
        try:
            lease = repo.take(claimant=me, ttl_ms=TTL_MS, holder_alive=dead)
        except LeaseHeld as exc:
            with lock:
                refused.append(exc)
            return
        with lock:
            won.append(lease)

    threads = [threading.Thread(target=take, args=(me,)) for me in takers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return won, refused


def test_racing_takers_of_a_free_lease_one_wins(engine: Engine) -> None:
    repo = LeaseRepository(engine, single_slot=True)
    takers = 6
    for _ in range(10):
        with engine.begin() as conn:
            conn.execute(worker_leases.delete())
        won, refused = _race(repo, [claimant(pid=i) for i in range(takers)])
        assert len(won) == 1, won
        assert len(refused) == takers - 1
        assert {r.holder for r in refused} == {won[0]}
        assert repo.current() == won[0]


def test_racing_takers_of_an_expired_lease_one_wins_and_one_event(engine: Engine) -> None:
    repo = LeaseRepository(engine, single_slot=True)
    takers = 6
    repo.take(claimant=claimant(), ttl_ms=TTL_MS, holder_alive=alive)
    for round_ in range(10):
        with engine.begin() as conn:  # the holder's host is gone: its lease has expired
            conn.execute(update(worker_leases).values(expires_at_ms=0))
        won, refused = _race(repo, [claimant(pid=i) for i in range(takers)])
        assert len(won) == 1, won
        assert won[0].epoch == round_ + 2
        assert len(refused) == takers - 1
        assert repo.current() == won[0]
    takeovers = [e for e in repo.history(limit=100) if e.type == "worker.lease_taken_over"]
    assert [e.data["new_epoch"] for e in takeovers] == list(range(2, 12))


# Several hosts need PostgreSQL (docs/several-hosts.md): no SQLite variant to skip.
@pytest.mark.parametrize("db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_on_postgresql_every_instance_holds_its_own_lease(engine: Engine) -> None:
    repo = LeaseRepository(engine)
    a = repo.take(claimant=claimant(host="host-a"), ttl_ms=TTL_MS, holder_alive=alive)
    b = repo.take(
        claimant=claimant(host="host-b"), ttl_ms=TTL_MS, holder_alive=alive,
        base_url="http://b:8000",
    )  # fmt: skip
    assert (a.epoch, b.epoch) == (1, 1)
    with pytest.raises(LeaseHeld) as refused:  # a second worker of host a's data dir
        repo.take(claimant=claimant(a.instance_id), ttl_ms=TTL_MS, holder_alive=alive)
    assert "SQLite" not in refused.value.detail
    repo.renew(instance_id=b.instance_id, epoch=1, ttl_ms=TTL_MS)
    assert {lease.instance_id: lease.base_url for lease in repo.leases()} == {
        a.instance_id: None, b.instance_id: "http://b:8000",
    }  # fmt: skip
    assert repo.current(a.instance_id) == a
