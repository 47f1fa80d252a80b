"""Several hosts on one database (docs/several-hosts.md): the completion fence, a vanished
host's attempts ended lost, and a worker's view scoped to its own instance."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, update

from app.domain.canonical import sha256_digest
from app.domain.errors import LeaseLost
from app.domain.ids import now_ms
from app.domain.model import Run
from app.domain.retention import GlobalBudgets, RetentionPolicy
from app.storage import hosts_repo
from app.storage.hosts_repo import Retired, expire_vanished_hosts, retire_host
from app.storage.lease_repo import LeaseRepository, Superseded
from app.storage.retention_repo import RetentionRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.storage.tables import attempts, runs, worker_leases
from app.worker.log_retention import LogSweep
from tests.storage.helpers import HANDLE, TOKEN, define_task, enqueue, event_types
from tests.storage.retention_kit import DAY_MS, file_and_row_agree, seed
from tests.storage.test_worker_lease import SHORT_TTL_MS, TTL_MS, alive, claimant


def _start_on(engine: Engine, run: Run, instance_id: str, epoch: int) -> Run:
    assert run.latest_attempt is not None
    repo = RunRepository(engine)
    run = repo.begin_dispatch(
        run_id=run.id, attempt_id=run.latest_attempt.id, expected_version=run.version,
        token_digest=sha256_digest(TOKEN.encode()), deadline_at_ms=None,
        log_artifact_id="log:" + run.latest_attempt.id, worker_instance_id=instance_id,
        lease_epoch=epoch,
    )  # fmt: skip
    assert run.latest_attempt is not None
    return repo.record_running(
        run_id=run.id, attempt_id=run.latest_attempt.id, handle=HANDLE,
        started_at_ms=run.created_at_ms,
    )  # fmt: skip


def _complete(engine: Engine, run: Run, fence: tuple[str, int]) -> str:
    assert run.latest_attempt is not None
    return RunRepository(engine).complete_attempt(
        run_id=run.id, attempt_id=run.latest_attempt.id, token=TOKEN, callback_sequence=1,
        exit_code=0, signal=None, finished_at_ms=run.created_at_ms + 1, fence=fence,
    ).status  # fmt: skip


def test_a_completion_whose_lease_epoch_is_superseded_writes_nothing(engine: Engine) -> None:
    leases = LeaseRepository(engine)
    me = claimant()
    first = leases.take(claimant=me, ttl_ms=TTL_MS, holder_alive=alive)
    define_task(engine)
    run = _start_on(engine, enqueue(engine), me.instance_id, first.epoch)
    slot = leases.slot_of(me.instance_id)
    # The same instance's next worker took the lease (epoch 2): the first one is stale.
    leases.take(claimant=me, ttl_ms=TTL_MS, holder_alive=lambda _lease: False)
    assert _complete(engine, run, (slot, first.epoch)) == "fenced"
    assert RunReader(engine).get_run(run.id).status == "running"
    assert _complete(engine, run, (slot, first.epoch + 1)) == "applied"
    assert event_types(engine, run.id).count("run.succeeded") == 1


# Several hosts need PostgreSQL (docs/several-hosts.md): no SQLite variant to skip.
@pytest.mark.parametrize("db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_a_vanished_hosts_attempts_end_lost_and_its_epoch_is_superseded(engine: Engine) -> None:
    leases = LeaseRepository(engine)
    a, b = claimant(host="host-a"), claimant(host="host-b")
    lease_a = leases.take(claimant=a, ttl_ms=TTL_MS, holder_alive=alive)
    # b's lease is long until b is seen live, then cut short: a slow set-up (a loaded host)
    # must not expire it early.
    lease_b = leases.take(claimant=b, ttl_ms=TTL_MS, holder_alive=alive)
    define_task(engine)
    on_a = _start_on(engine, enqueue(engine), a.instance_id, lease_a.epoch)
    on_b = [_start_on(engine, enqueue(engine), b.instance_id, lease_b.epoch) for _ in range(3)]
    reader_a = RunReader(engine, worker_instance_id=a.instance_id)
    assert [x.run_id for x in reader_a.active_attempts(limit=10)] == [on_a.id]
    me = {"me_slot": leases.slot_of(a.instance_id), "me_instance_id": a.instance_id}

    assert expire_vanished_hosts(engine, **me, me_host="host-a", limit=2) == []  # b is live
    leases.renew(instance_id=b.instance_id, epoch=lease_b.epoch, ttl_ms=SHORT_TTL_MS)
    time.sleep(SHORT_TTL_MS / 1000)
    first = expire_vanished_hosts(engine, **me, me_host="host-a", limit=2)  # one page of 2
    second = expire_vanished_hosts(engine, **me, me_host="host-a", limit=2)
    third = expire_vanished_hosts(engine, **me, me_host="host-a", limit=2)  # nothing left

    assert [(h.instance_id, h.old_epoch, h.new_epoch, h.lost) for h in first + second] == [
        (b.instance_id, 1, 2, 2), (b.instance_id, 2, 3, 1),
    ]  # fmt: skip
    assert third == []
    reader = RunReader(engine)
    for run in on_b:
        got = reader.get_run(run.id)
        assert got.status == "lost" and got.latest_attempt is not None
        assert got.latest_attempt.error_code == "WORKER_LEASE_EXPIRED"
        assert [t for t in event_types(engine, run.id) if t.startswith("run.")][-1] == "run.lost"
        assert _complete(engine, run, (leases.slot_of(b.instance_id), 1)) == "fenced"
    assert reader.get_run(on_a.id).status == "running"  # the live host's run is untouched
    history = [e for e in leases.history(limit=10) if e.type == "worker.lease_expired"]
    assert [e.data["attempts_lost"] for e in history] == [2, 1]
    assert history[0].data["by_instance_id"] == a.instance_id
    # What `lease show` says of b's row: its epoch (3) is not the one its pid held (1).
    assert leases.superseded(b.instance_id, 3) == Superseded(1, "host-a", 3)
    assert leases.superseded(a.instance_id, lease_a.epoch) is None  # never moved
    with pytest.raises(LeaseLost) as lost:  # the partitioned worker comes back
        leases.renew(instance_id=b.instance_id, epoch=1, ttl_ms=TTL_MS)
    assert "superseded" in lost.value.detail


def test_an_operator_retires_a_stopped_hosts_lease_and_its_runs_end_lost_once(
    engine: Engine,
) -> None:
    """A host stopped for good (its lease released by an orderly stop, or expired) left its
    runs running: no live worker expires a released lease. ``lease retire`` ends them lost
    WORKER_RETIRED, page by page as an expiry does (epoch bumped, so that worker's late
    completions are fenced), and is refused while the lease is held."""
    leases = LeaseRepository(engine)
    a = claimant(host="host-a")
    lease = leases.take(claimant=a, ttl_ms=TTL_MS, holder_alive=alive)
    define_task(engine)
    on_a = [_start_on(engine, enqueue(engine), a.instance_id, lease.epoch) for _ in range(3)]
    slot = leases.slot_of(a.instance_id)

    def retire(instance_id: str = a.instance_id) -> Retired:
        return retire_host(engine, slot=slot, instance_id=instance_id, by_host="ops", limit=2)

    held = retire()
    assert (held.state, held.host, held.attempts_lost) == ("held", "host-a", 0)
    assert retire(claimant().instance_id).state == "unknown"
    reader = RunReader(engine)
    assert {reader.get_run(r.id).status for r in on_a} == {"running"}

    assert leases.release(instance_id=a.instance_id, epoch=lease.epoch)
    done = retire()
    assert (done.state, done.attempts_lost, done.epoch) == ("retired", 3, lease.epoch + 2)
    for run in on_a:
        got = reader.get_run(run.id)
        assert got.status == "lost" and got.latest_attempt is not None
        assert got.latest_attempt.error_code == "WORKER_RETIRED"
        assert [t for t in event_types(engine, run.id) if t.startswith("run.")][-1] == "run.lost"
        assert _complete(engine, run, (slot, lease.epoch)) == "fenced"  # its worker, late
        assert [t for t in event_types(engine, run.id) if t == "run.lost"] == ["run.lost"]
    history = [e for e in leases.history(limit=10) if e.type == "worker.retired"]
    assert [(e.data["attempts_lost"], e.data["by_host"]) for e in history] == [(2, "ops"), (1, "ops")]
    assert retire() == Retired("retired", "host-a", 0, lease.epoch + 2)  # nothing left: no event
    assert len([e for e in leases.history(limit=10) if e.type == "worker.retired"]) == 2
    # What `lease show` says of the row: retired, from which host, how many runs it ended.
    assert leases.superseded(a.instance_id, lease.epoch + 2) == Superseded(
        lease.epoch, "ops", 3, retired=True
    )

    # Its worker comes back after all: it takes its lease again (and settles its journal).
    again = leases.take(claimant=a, ttl_ms=SHORT_TTL_MS, holder_alive=lambda _lease: False)
    assert again.epoch == lease.epoch + 3
    late = _start_on(engine, enqueue(engine), a.instance_id, again.epoch)
    time.sleep(SHORT_TTL_MS / 1000)  # then it vanishes: an expired lease may be retired too
    assert retire().attempts_lost == 1
    assert reader.get_run(late.id).status == "lost"


def test_a_retire_that_meets_its_worker_back_between_pages_says_what_it_ended(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's worker takes its lease again after the first page: the rest are that
    worker's (refused as held), and the pages already ended are counted, not hidden."""
    leases = LeaseRepository(engine)
    a = claimant(host="host-a")
    lease = leases.take(claimant=a, ttl_ms=TTL_MS, holder_alive=alive)
    define_task(engine)
    on_a = [_start_on(engine, enqueue(engine), a.instance_id, lease.epoch) for _ in range(3)]
    assert leases.release(instance_id=a.instance_id, epoch=lease.epoch)
    first_page = hosts_repo._end_page

    def then_back(*args: Any, **kwargs: Any) -> Any:
        ended = first_page(*args, **kwargs)
        leases.take(claimant=a, ttl_ms=TTL_MS, holder_alive=lambda _lease: False)
        return ended

    monkeypatch.setattr(hosts_repo, "_end_page", then_back)
    done = retire_host(engine, slot=leases.slot_of(a.instance_id), instance_id=a.instance_id,
                       by_host="ops", limit=2)  # fmt: skip
    assert (done.state, done.attempts_lost) == ("held", 2)
    assert sorted(RunReader(engine).get_run(r.id).status for r in on_a) == ["lost", "lost", "running"]


def test_a_hosts_retention_sees_only_the_logs_that_host_holds(engine: Engine) -> None:
    define_task(engine)
    mine = _start_on(engine, enqueue(engine), "host-a", 1)
    theirs = _start_on(engine, enqueue(engine), "host-b", 1)
    for run in (mine, theirs):
        assert run.latest_attempt is not None
        RunRepository(engine).complete_attempt(
            run_id=run.id, attempt_id=run.latest_attempt.id, token=TOKEN, callback_sequence=1,
            exit_code=0, signal=None, finished_at_ms=run.created_at_ms + 1,
        )  # fmt: skip
    scoped = RetentionRepository(engine, worker_instance_id="host-a")
    assert [c.run_id for _, c in scoped.global_candidates(limit=10)] == [mine.id]
    assert [c.run_id for c in scoped.log_candidates("job", limit=10)] == [mine.id]
    everyone = RetentionRepository(engine)  # SQLite, or the api's figures
    assert {c.run_id for _, c in everyone.global_candidates(limit=10)} == {mine.id, theirs.id}


def test_a_hosts_byte_budgets_count_only_the_logs_that_host_holds(
    engine: Engine, tmp_path: Path
) -> None:
    # One log of no recorded host (older than migration 0008), then 3 of host a, then 3 of
    # host b, 10 bytes each: 70 in all, 40 on each host's books (the old one counts on both,
    # as it is a candidate on both).
    root = tmp_path / "logs"
    old = seed(engine, root, tasks=["t"], runs_per_task=1, start_ms=now_ms() - DAY_MS)
    on_a = seed(engine, root, tasks=["t"], runs_per_task=3, start_ms=now_ms() - DAY_MS + 10)
    on_b = seed(engine, root, tasks=["t"], runs_per_task=3, start_ms=now_ms() - DAY_MS + 20)
    with engine.begin() as conn:
        for host, seeded in (("host-a", on_a), ("host-b", on_b)):
            ids = [s.attempt_id for s in seeded]
            conn.execute(
                update(attempts).where(attempts.c.id.in_(ids)).values(worker_instance_id=host)
            )
    repo_a = RetentionRepository(engine, worker_instance_id="host-a")
    repo_b = RetentionRepository(engine, worker_instance_id="host-b")
    assert (repo_b.task_log_bytes("t"), repo_b.total_log_bytes()) == (40, 40)
    assert RetentionRepository(engine).total_log_bytes() == 70

    def sweep(repo: RetentionRepository, task_bytes: int | None, total: int | None) -> int:
        policy = RetentionPolicy(
            keep_runs=10, keep_days=0, keep_rows=100, task_log_bytes=task_bytes
        )
        return LogSweep(
            repo=repo, logs_root=root, policy=policy,
            budgets=GlobalBudgets(total_log_bytes=total, free_reserve_bytes=0),
            tasks_per_pass=10, files_per_pass=100, free_bytes=lambda _root: None,
        ).run_pass().expired_logs  # fmt: skip

    # Host b's 40 bytes are within its task budget of 40: it keeps its recent logs (counting
    # a's too, it expired the old log and two of its own, a's older ones kept).
    assert sweep(repo_b, 40, None) == 0
    # Host a's 40 bytes are 10 over its total budget of 30: it pays those 10 bytes, with the
    # oldest log it may expire, not the 40 that the logs of both hosts are over.
    assert sweep(repo_a, None, 30) == 1
    with engine.connect() as conn:
        gone = conn.execute(select(attempts.c.id).where(attempts.c.log_state.is_not(None)))
        assert [r[0] for r in gone] == [old[0].attempt_id]
    assert file_and_row_agree(engine, root) == ([], [])


@pytest.mark.parametrize("db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
@pytest.mark.parametrize("locked", ["lease", "run"])
def test_a_host_frozen_mid_transaction_is_passed_over_within_the_lock_timeout(
    engine: Engine, locked: str
) -> None:
    # Host b froze (or was cut off) inside a transaction: its lease renewal's, or a run's
    # compare-and-set. Its locks stay until the server ends that session; the live host's
    # pass, on its lease thread, must give up on b within the lock timeout rather than wait,
    # and still end c, which vanished cleanly (after b: b's expiry is looked at first).
    leases = LeaseRepository(engine)
    a, b, c = claimant(host="host-a"), claimant(host="host-b"), claimant(host="host-c")
    leases.take(claimant=a, ttl_ms=TTL_MS, holder_alive=alive)
    lease_b = leases.take(claimant=b, ttl_ms=TTL_MS, holder_alive=alive)
    lease_c = leases.take(claimant=c, ttl_ms=TTL_MS, holder_alive=alive)
    define_task(engine)
    on_b = _start_on(engine, enqueue(engine), b.instance_id, lease_b.epoch)
    on_c = _start_on(engine, enqueue(engine), c.instance_id, lease_c.epoch)
    for lease in (lease_b, lease_c):  # both expire at once, b first
        leases.renew(instance_id=lease.instance_id, epoch=lease.epoch, ttl_ms=1)
        time.sleep(0.01)
    me = {"me_slot": leases.slot_of(a.instance_id), "me_instance_id": a.instance_id}
    row = (
        select(worker_leases).where(worker_leases.c.slot == leases.slot_of(b.instance_id))
        if locked == "lease"
        else select(runs).where(runs.c.id == on_b.id)
    )
    outcome: list[BaseException | list[Any]] = []

    def expire() -> None:
        try:
            outcome.append(expire_vanished_hosts(engine, **me, me_host="host-a", limit=10))
        except BaseException as exc:
            outcome.append(exc)

    with engine.connect() as frozen:
        frozen.execute(row.with_for_update())  # b's open transaction, holding the row
        began = time.monotonic()
        pass_ = threading.Thread(target=expire)
        pass_.start()
        pass_.join(10)
        took = time.monotonic() - began
        frozen.rollback()  # b's session ends (the server's idle-in-transaction timeout)
    pass_.join(10)
    assert took < 5, f"the pass waited {took:.1f} s on the frozen host's lock (timeout 1 s)"
    [ended] = outcome
    assert isinstance(ended, list), ended
    assert [(h.instance_id, h.old_epoch, h.new_epoch, h.lost) for h in ended] == [
        (c.instance_id, 1, 2, 1),
    ]  # fmt: skip
    assert RunReader(engine).get_run(on_c.id).status == "lost"
    # Nothing of b was written: its run still running, its epoch unchanged.
    assert RunReader(engine).get_run(on_b.id).status == "running"
    current = leases.current(b.instance_id)
    assert current is not None and current.epoch == lease_b.epoch
    # Once the lock is gone, the next pass ends b's attempt.
    [done] = expire_vanished_hosts(engine, **me, me_host="host-a", limit=10)
    assert (done.instance_id, done.old_epoch, done.new_epoch, done.lost) == (
        b.instance_id, 1, 2, 1,
    )  # fmt: skip
    assert RunReader(engine).get_run(on_b.id).status == "lost"
