"""The worker's lease keeper on both engines: renews, notices a takeover, gates launches."""

from __future__ import annotations

import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.exc import OperationalError

from app.context import worker_lease
from app.context.execution_wiring import DispatchBackoff, build_execution
from app.context.worker_lease import LeaseKeeper
from app.context.worker_process import WorkerProcess
from app.domain.errors import LaunchFailed
from app.domain.execution import Launched, LaunchRequest, StopResult
from app.domain.ids import now_ms
from app.domain.model import ProcessHandle
from app.settings import Settings
from app.storage.definitions_repo import DefinitionRepository
from app.storage.engine import make_engine
from app.storage.lease_repo import LeaseRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.storage.tables import worker_leases
from app.storage.uow import UnitOfWork
from app.worker.server import ControlServer
from tests.disk import fill, mounted_tmpfs
from tests.execution.kit import CountingClient, MemorySecrets, define, enqueue
from tests.storage.helpers import HANDLE
from tests.storage.retention_kit import DAY_MS, counts, seed
from tests.storage.test_worker_lease import claimant

REQUEST = LaunchRequest(
    run_id="r",
    attempt_id="a",
    callback_sequence=1,
    token="t",
    argv=("true",),
    cwd=None,
    env={},
    log_path="/nonexistent",
    log_quota_bytes=1,
    deadline_at_ms=None,
)  # fmt: skip  (never read: the gate refuses, the counting launcher only counts)


class CountingLauncher:
    """Stands in for the shim launcher: counts the launches that reached it."""

    def __init__(self) -> None:
        self.calls = 0

    def launch_started(self, request: LaunchRequest, *, t2: bool = False) -> Launched:
        self.calls += 1
        return Launched(HANDLE, None)


def settings(db_url: str, data_dir: Path, ttl_s: float = 1.0, renew_s: float = 0.1) -> Settings:
    """Settings with a short lease."""
    data_dir.mkdir(exist_ok=True)
    return Settings.from_env(
        {
            "QL_DATA_DIR": str(data_dir),
            "QL_DATABASE_URL": db_url,
            "QL_WORKER_LEASE_TTL_S": str(ttl_s),
            "QL_WORKER_LEASE_RENEW_S": str(renew_s),
        }
    )


def test_the_keeper_renews_past_the_ttl_and_releases_on_shutdown(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    lost = threading.Event()
    # A 2 s TTL renewed every 0.1 s: one renewal stalled under a second (an fsync on a loaded
    # host) must not lose it.
    keeper = LeaseKeeper.take(
        settings=settings(db_url, tmp_path / "a", ttl_s=2.0), engine=engine, on_lost=lost.set
    )
    first = keeper.lease
    try:
        time.sleep(2.5)  # past the TTL
        repo = LeaseRepository(engine)
        current = repo.current(first.instance_id)
        assert current is not None and current.epoch == first.epoch
        assert current.expires_at_ms > first.expires_at_ms + 1000
        assert keeper.held() and not lost.is_set()
    finally:
        keeper.release()
    assert [e.type for e in LeaseRepository(engine).history(limit=10)] == [
        "worker.lease_acquired",
        "worker.lease_released",
    ]


def test_a_takeover_is_noticed_launches_are_refused_and_nothing_is_released(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    lost = threading.Event()
    keeper = LeaseKeeper.take(
        settings=settings(db_url, tmp_path / "a"), engine=engine, on_lost=lost.set
    )
    inner = CountingLauncher()
    gated = keeper.gate(inner)
    try:
        gated.launch_started(REQUEST)
        assert inner.calls == 1
        with engine.begin() as conn:  # another worker took it over (epoch bumped)
            conn.execute(update(worker_leases).values(epoch=worker_leases.c.epoch + 1))
        assert lost.wait(5), "the keeper did not notice the new epoch"
        assert keeper.lost and not keeper.held()
        with pytest.raises(LaunchFailed) as refused:
            gated.launch_started(REQUEST)
        assert refused.value.reason == "WORKER_LEASE_LOST"
        assert inner.calls == 1
    finally:
        keeper.release()
    repo = LeaseRepository(engine)
    assert [e.type for e in repo.history(limit=10)] == ["worker.lease_acquired"]
    current = repo.current(keeper.lease.instance_id)
    assert current is not None and current.released_at_ms is None  # not ours to release


def test_a_worker_cut_off_from_the_database_for_a_ttl_stops_launching_before_expiry(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    lost = threading.Event()
    keeper = LeaseKeeper.take(
        settings=settings(db_url, tmp_path / "a"), engine=engine, on_lost=lost.set
    )
    gated = keeper.gate(CountingLauncher())
    try:
        with UnitOfWork(engine) as uow:  # every renewal now waits behind this writer
            uow.conn.execute(select(worker_leases).with_for_update())
            blocked_at = time.monotonic()
            while keeper.held():
                assert time.monotonic() - blocked_at < 5, "still trusted without a renewal"
                time.sleep(0.02)
            assert not lost.is_set()  # the renewal is still waiting: the clock decided
            with pytest.raises(LaunchFailed):
                gated.launch_started(REQUEST)
            time.sleep(1.5)  # cut off for longer than the whole TTL
        assert lost.wait(30), "a renewal that came after the TTL did not end the lease"
        assert keeper.lost
    finally:
        keeper.release()


def test_a_lease_lost_behind_a_silent_database_stops_without_waiting_on_the_holders_read(
    engine: Engine, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    # Behind a silent partition every round trip waits its bounds (docs/worker-lease.md,
    # "Limits"): once the TTL ran out, the read of who holds the lease now (for the line)
    # must not hold up the stop; it once waited a connect timeout or more first.
    lost = threading.Event()
    keeper = LeaseKeeper.take(
        settings=settings(db_url, tmp_path / "a"), engine=engine, on_lost=lost.set
    )
    silent = threading.Event()

    def unreachable(**_: object) -> None:
        raise OperationalError("renew", {}, Exception("no route to host"))

    def current(*_: object) -> None:
        silent.wait(30)  # no answer until the test ends

    monkeypatch.setattr(keeper._repo, "renew", unreachable)
    monkeypatch.setattr(keeper._repo, "current", current)
    try:
        bound = keeper._ttl_s + worker_lease.HOLDER_READ_S + 2.0  # 2 s: a loaded host
        assert lost.wait(bound), "the stop waited for the database's answer"
        assert keeper.lost
        assert any(
            "could not be renewed before it expired" in r.getMessage() for r in caplog.records
        )
    finally:
        silent.set()
        keeper.release()


def test_a_lease_lost_after_the_drains_ping_requeues_the_run_and_launches_nothing(
    engine: Engine, db_url: str, tmp_path: Path, short_dir: Path
) -> None:
    """The crash window between the drain's ping and its launch: the ping was answered with
    the lease, then another worker took the lease over. The worker refuses the launch before
    the journal (WORKER_LEASE_LOST), the client calls that unavailable, and the run goes back
    to the queue (attempt 1 EXECUTOR_UNAVAILABLE), never failed. The next drain's ping is
    refused, and nothing is launched."""
    now = [0.0]
    pause = DispatchBackoff(clock=lambda: now[0])
    # A TTL long enough that a loaded host never lets the lease lapse on its own (the first
    # ping must be answered with it); renewals often enough to notice the takeover at once.
    config = settings(db_url, tmp_path / "a", ttl_s=10.0, renew_s=0.2)
    lost = threading.Event()
    keeper = LeaseKeeper.take(settings=config, engine=engine, on_lost=lost.set)
    inner = CountingLauncher()
    server = ControlServer(
        path=short_dir / "w.sock", launcher=keeper.gate(inner), controller=_NoStops(),
        lease_facts=keeper.ping_facts,
    )  # fmt: skip
    server.start()

    def take_over() -> None:  # right after the first ping was answered
        with engine.begin() as conn:
            conn.execute(update(worker_leases).values(epoch=worker_leases.c.epoch + 1))
        assert lost.wait(5), "the keeper did not notice the new epoch"

    client = CountingClient(server.path, after_first_ping=take_over)
    hooks = build_execution(
        config, candidates=RunReader(engine), definitions=DefinitionRepository(engine),
        secrets=MemorySecrets(), transitions=RunRepository(engine), client=client, backoff=pause,
    )  # fmt: skip
    try:
        define(engine)
        run = enqueue(engine)
        hooks.drain()  # the ping is answered, then the launch meets the refusal
        assert (client.pings, inner.calls) == (1, 0)
        after = RunReader(engine).get_run(run.id)
        first = RunReader(engine).get_attempt(run.id, 1)
        assert after.status == "queued" and first.error_code == "EXECUTOR_UNAVAILABLE"
        assert pause.delay_s > 0  # the drain backs off, as for any unavailability
        now[0] += pause.delay_s
        hooks.drain()  # the next drain's ping is refused: nothing launched, nothing requeued
        assert (client.pings, inner.calls) == (2, 0)
        after = RunReader(engine).get_run(run.id)
        assert after.status == "queued" and after.latest_attempt is not None
        assert after.latest_attempt.number == 2
    finally:
        hooks.close()
        server.close()
        keeper.release()


class _NoStops:
    def stop(self, handle: ProcessHandle, *, grace_seconds: float) -> StopResult:
        raise AssertionError("nothing was launched, so nothing is stopped")


def test_renewals_refused_by_a_full_disk_are_retried_and_the_lease_kept(
    tmp_path: Path, sqlite_template: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A real full disk under the SQLite database: the renewals that cannot commit are
    # retried within the TTL, and once space returns the lease is renewed again. (The
    # keeper's thread once died on the first refusal, and the worker then refused every
    # launch until it was restarted.)
    with mounted_tmpfs(tmp_path / "disk", size_mib=20) as disk:
        db = disk / "qinglong.db"
        shutil.copyfile(sqlite_template, db)
        url = f"sqlite:///{db}"
        engine = make_engine(url)
        lost = threading.Event()
        keeper = LeaseKeeper.take(
            settings=settings(url, disk / "data", ttl_s=30.0), engine=engine, on_lost=lost.set
        )
        filler = disk / "filler"
        try:
            fill(disk)
            _write_until_refused(db)  # the WAL's end reached: the next renewal needs space
            deadline = time.monotonic() + 10
            while not any(
                "renewal failed (StorageUnavailable)" in r.getMessage() for r in caplog.records
            ):
                assert time.monotonic() < deadline, "no renewal met the full disk"
                time.sleep(0.05)
            filler.unlink()
            freed = LeaseRepository(engine).current(keeper.lease.instance_id)
            assert freed is not None
            deadline = time.monotonic() + 10
            while keeper.lease.renewed_at_ms <= freed.renewed_at_ms:
                assert keeper._thread.is_alive(), "the keeper's thread died on the full disk"
                assert time.monotonic() < deadline, "no renewal after space returned"
                time.sleep(0.05)
            assert keeper.held() and not lost.is_set()
        finally:
            filler.unlink(missing_ok=True)  # so that the release can commit, even on a failure
            try:
                keeper.release()
            finally:
                engine.dispose()  # no file of the disk left open: it unmounts


def _write_until_refused(db: Path) -> None:
    """Commit until the full disk refuses one, so the WAL has no room left (bounded: a WAL
    that restarted from its beginning reuses its space; the test then waits for the
    renewal's own refusal)."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=5)
    try:
        for _ in range(2_000):
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute("UPDATE worker_leases SET renewed_at_ms = renewed_at_ms")
                conn.execute("COMMIT")
            except sqlite3.OperationalError:
                conn.execute("ROLLBACK")
                return
    finally:
        conn.close()


def test_a_worker_whose_lease_is_lost_runs_no_retention_pass(
    engine: Engine, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/several-hosts.md §4: a host whose lease is not surely held decides nothing; the
    # retention sweep is gated like the recovery loop.
    data_dir = tmp_path / "a"
    data_dir.mkdir()
    s = Settings.from_env(
        {
            "QL_DATA_DIR": str(data_dir), "QL_DATABASE_URL": db_url,
            "QL_WORKER_LEASE_TTL_S": "1.0", "QL_WORKER_LEASE_RENEW_S": "0.1",
            "QL_RETENTION_KEEP_RUNS": "1", "QL_RETENTION_KEEP_DAYS": "0",
            "QL_RETENTION_INTERVAL_S": "3600",
        }
    )  # fmt: skip
    lost = threading.Event()
    keeper = LeaseKeeper.take(settings=s, engine=engine, on_lost=lost.set)
    checks: list[bool] = []
    held = keeper.held

    def counted() -> bool:
        checks.append(held())
        return checks[-1]

    monkeypatch.setattr(keeper, "held", counted)
    process = WorkerProcess(s)
    process.lease = keeper
    start = now_ms() - DAY_MS
    seed(engine, s.logs_dir, tasks=["t"], runs_per_task=3, start_ms=start)
    loop = process._retention(engine)
    assert loop is not None
    try:
        loop.start()
        deadline = time.monotonic() + 10
        while loop.passes < 1:  # held: the start-up pass expires all but the newest log
            assert time.monotonic() < deadline, "no retention pass while the lease is held"
            time.sleep(0.01)
        assert counts(engine)["expired"] == 2
        with engine.begin() as conn:  # another worker took it over (epoch bumped)
            conn.execute(update(worker_leases).values(epoch=worker_leases.c.epoch + 1))
        assert lost.wait(5), "the keeper did not notice the new epoch"
        seed(engine, s.logs_dir, tasks=["t"], runs_per_task=3, start_ms=start + 100)
        asked = len(checks)
        loop.kick("t")  # a run of t ended: a held worker would sweep t within a second
        deadline = time.monotonic() + 10
        while len(checks) < asked + 3:  # the loop came round three times and looked
            assert loop.passes == 1, "a retention pass ran after the lease was lost"
            assert time.monotonic() < deadline, "the retention loop never asked for the lease"
            time.sleep(0.01)
        assert loop.passes == 1 and not any(checks[asked:])
        assert counts(engine)["expired"] == 2  # the 3 newer logs' elders all still there
    finally:
        loop.stop()
        keeper.release()


# Several hosts need PostgreSQL (docs/several-hosts.md): no SQLite variant to skip.
@pytest.mark.parametrize("db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_a_vanished_host_pass_that_keeps_failing_is_one_line_then_its_recovery(
    engine: Engine, db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The pass runs after every renewal; failing, it wrote a line each time (360 an hour
    at the default cadence). A real failing statement: another host's lease has expired and
    the attempts table it reads is away; then back."""
    LeaseRepository(engine).take(
        claimant=claimant(host="host-b"), ttl_ms=1, holder_alive=lambda _lease: True
    )
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE attempts RENAME TO attempts_away")
    lost = threading.Event()
    with caplog.at_level("INFO", logger="app.context.worker_lease"):
        keeper = LeaseKeeper.take(
            settings=settings(db_url, tmp_path / "a", ttl_s=5.0, renew_s=0.05), engine=engine,
            on_lost=lost.set,
        )  # fmt: skip
        try:
            time.sleep(1.5)  # some 30 passes, every one failing
            failing = [r.getMessage() for r in caplog.records if "vanished-host" in r.getMessage()]
            with engine.begin() as conn:
                conn.exec_driver_sql("ALTER TABLE attempts_away RENAME TO attempts")
            wait_for = time.monotonic() + 5
            while time.monotonic() < wait_for and not any(
                "works again" in r.getMessage() for r in caplog.records
            ):
                time.sleep(0.05)
        finally:
            keeper.release()
    assert failing == ["vanished-host pass failed: NotMigrated"]  # the table is away
    said = [r.getMessage() for r in caplog.records if "vanished-host" in r.getMessage()]
    assert said[0] == failing[0] and len(said) == 2, said
    assert said[1].startswith("vanished-host pass works again after ")
    assert not lost.is_set()
