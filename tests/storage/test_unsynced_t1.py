"""T1 commits without waiting for its sync; the journal reserve's synced commit covers it.

docs/design.md §5.3 ("T1 is not synced on its own"). What must hold:

* on SQLite, T1's transaction commits under ``PRAGMA synchronous=NORMAL`` and every other
  write of a run's path under FULL; the connection is back to FULL when it returns to the
  pool, so no later write inherits the lighter commit;
* a synced unit of work never shares an unsynced commit: one that finds an unsynced group
  open commits that group first; an unsynced one joins a synced group (and is synced);
* on PostgreSQL, T1 says ``synchronous_commit off`` inside its lock statement (no round
  trip of its own), it holds for T1's transaction only, and the worker's reserve, synced,
  flushes the WAL past T1's commit before any job could start.

SQLite's level is read back from the connection at each commit (the setting SQLite's
commit itself obeys); PostgreSQL's flush position from ``pg_current_wal_flush_lsn()``.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

from app.domain.model import ProcessHandle
from app.storage.engine import make_engine
from app.storage.journal_repo import JournalRepository
from app.storage.runs_repo import _ADMISSION_LOCK_UNSYNCED, RunRepository
from app.storage.uow import UnitOfWork, _writer_gate
from tests.storage.helpers import define_task
from tests.storage.test_group_commit import WAIT_S, _until

FULL, NORMAL = 2, 1


@pytest.fixture
def sqlite_engine(sqlite_template: Path, tmp_path: Path) -> Iterator[Engine]:
    path = tmp_path / "qinglong.db"
    shutil.copyfile(sqlite_template, path)
    engine = make_engine(f"sqlite:///{path}")
    yield engine
    engine.dispose()


def _levels_at_commit(engine: Engine, raws: list[Any] | None = None) -> list[int]:
    """Appends, at every COMMIT, the connection's ``PRAGMA synchronous`` then (and, to
    ``raws``, the driver's connection that committed)."""
    levels: list[int] = []

    @event.listens_for(engine, "commit")
    def _committed(conn: Any) -> None:
        raw = conn.connection.dbapi_connection
        levels.append(raw.execute("PRAGMA synchronous").fetchone()[0])
        if raws is not None:
            raws.append(raw)

    return levels


def _level_of(raw: Any) -> int:
    """The level of one driver connection, idle in the pool: the very one that committed."""
    return int(raw.execute("PRAGMA synchronous").fetchone()[0])


def _t1(repo: RunRepository, run: Any, **budgets: Any) -> Any:
    assert run.latest_attempt is not None
    return repo.begin_dispatch(
        run_id=run.id, attempt_id=run.latest_attempt.id, expected_version=None,
        token_digest="0" * 64, deadline_at_ms=None, log_artifact_id="log", **budgets,
    )  # fmt: skip


def _handle() -> ProcessHandle:
    return ProcessHandle(
        boot_id="b", pid=10, pgid=10, start_ticks=1, shim_pid=9, shim_start_ticks=1
    )


def test_sqlite_t1_alone_commits_unsynced_and_the_run_path_around_it_synced(
    sqlite_engine: Engine,
) -> None:
    define_task(sqlite_engine)
    repo = RunRepository(sqlite_engine)
    raws: list[Any] = []
    levels = _levels_at_commit(sqlite_engine, raws)
    run, _ = repo.enqueue_run(task="job", revision=None, priority=None)
    assert levels == [FULL]
    assert _t1(repo, run, max_running=8).status == "dispatching"
    assert levels == [FULL, NORMAL]
    # The connection T1 committed on is FULL again, idle in the pool, for whoever takes it.
    assert _level_of(raws[1]) == FULL
    assert run.latest_attempt is not None
    JournalRepository(sqlite_engine).reserve(
        attempt_id=run.latest_attempt.id, run_id=run.id, receipt_ref="r", only_if_starting=True
    )
    repo.record_running(
        run_id=run.id, attempt_id=run.latest_attempt.id, handle=_handle(), started_at_ms=1
    )
    assert levels == [FULL, NORMAL, FULL, FULL]


def test_sqlite_a_failed_unsynced_unit_hands_back_a_full_connection(
    sqlite_engine: Engine,
) -> None:
    raw: Any = None
    with pytest.raises(ValueError), UnitOfWork(sqlite_engine, grouped=True, synced=False) as uow:
        assert uow.conn.exec_driver_sql("PRAGMA synchronous").scalar_one() == NORMAL
        raw = uow.conn.connection.dbapi_connection
        raise ValueError("the caller's refusal")
    assert _level_of(raw) == FULL


class _Writer(threading.Thread):
    """One grouped write of ``value`` into ``t``; with ``hold``, it commits only once
    another writer waits at the gate (so a group is open when that one gets it)."""

    def __init__(self, engine: Engine, value: int, *, synced: bool, hold: bool) -> None:
        super().__init__(daemon=True)
        self.engine, self.value, self.synced, self.hold = engine, value, synced, hold
        self.error: BaseException | None = None
        self.returned = threading.Event()

    def run(self) -> None:
        gate = _writer_gate(self.engine)
        assert gate is not None
        try:
            with UnitOfWork(self.engine, grouped=True, synced=self.synced) as uow:
                uow.conn.execute(text("INSERT INTO t (v) VALUES (:v)"), {"v": self.value})
                if self.hold:
                    _until(lambda: gate.waiting > 0, "a second writer at the gate")
                uow.commit()
            self.returned.set()
        except BaseException as exc:
            self.error = exc


@pytest.mark.parametrize(
    ("first_synced", "second_synced", "commits"),
    [
        # A synced write never rides an unsynced commit: the open group commits first.
        (False, True, [(1, NORMAL), (1, FULL)]),
        # An unsynced write joins a synced group and is synced with it.
        (True, False, [(2, FULL)]),
    ],
)
def test_sqlite_a_group_commits_synced_whenever_a_member_needs_it(
    tmp_path: Path, first_synced: bool, second_synced: bool, commits: list[tuple[int, int]]
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'g.db'}")
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (v INTEGER UNIQUE)"))
        inserts = [0]
        seen: list[tuple[int, int]] = []

        @event.listens_for(engine, "before_cursor_execute")
        def _insert(_c: Any, _cur: Any, statement: str, *_rest: Any) -> None:
            inserts[0] += statement.lstrip().upper().startswith("INSERT")

        @event.listens_for(engine, "commit")
        def _committed(conn: Any) -> None:
            raw = conn.connection.dbapi_connection
            seen.append((inserts[0], raw.execute("PRAGMA synchronous").fetchone()[0]))
            inserts[0] = 0

        gate = _writer_gate(engine)
        assert gate is not None
        first = _Writer(engine, 1, synced=first_synced, hold=True)
        second = _Writer(engine, 2, synced=second_synced, hold=False)
        first.start()
        _until(lambda: gate.holder is not None, "the first writer's body")
        second.start()
        first.join(WAIT_S)
        second.join(WAIT_S)
        assert first.error is None and second.error is None
        assert first.returned.is_set() and second.returned.is_set()
        assert seen == commits
        with engine.connect() as conn:
            assert conn.execute(text("SELECT v FROM t ORDER BY v")).scalars().all() == [1, 2]
        for pooled in _pooled_raws(engine):
            assert _level_of(pooled) == FULL
    finally:
        engine.dispose()


def _pooled_raws(engine: Engine) -> list[Any]:
    """Every driver connection the pool holds, checked out at once (each a distinct one)."""
    held = []
    try:
        for _ in range(engine.pool.checkedin()):
            held.append(engine.raw_connection())
        return [h.driver_connection for h in held]
    finally:
        for h in held:
            h.close()


def _pg_levels_at_commit(engine: Engine) -> list[str]:
    """Appends, at every COMMIT, the connection's ``synchronous_commit`` then."""
    levels: list[str] = []

    @event.listens_for(engine, "commit")
    def _committed(conn: Any) -> None:
        raw = conn.connection.dbapi_connection
        levels.append(raw.execute("SHOW synchronous_commit").fetchone()[0])

    return levels


@pytest.mark.postgres
def test_pg_t1_skips_its_flush_in_its_lock_and_the_reserve_flushes_past_it(
    pg_engine: Engine,
) -> None:
    define_task(pg_engine)
    repo = RunRepository(pg_engine)
    run, _ = repo.enqueue_run(task="job", revision=None, priority=None)
    sent: list[str] = []
    used: list[Any] = []

    def record(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(" ".join(statement.split()))
        used.append(conn.connection.dbapi_connection)

    event.listen(pg_engine, "before_cursor_execute", record)
    at_commit = _pg_levels_at_commit(pg_engine)
    try:
        assert _t1(repo, run, max_running=8).status == "dispatching"
    finally:
        event.remove(pg_engine, "before_cursor_execute", record)
    assert at_commit == ["off"]  # in force when T1's COMMIT was sent
    # No statement of its own: the setting rides in the admission lock's.
    assert len(sent) == 3, sent
    assert "pg_advisory_xact_lock" in sent[1] and "synchronous_commit" in sent[1], sent
    # And that statement turns it off for its own transaction (not its text alone).
    with pg_engine.begin() as conn:
        conn.execute(_ADMISSION_LOCK_UNSYNCED)
        assert conn.exec_driver_sql("SHOW synchronous_commit").scalar_one() == "off"
    # SET LOCAL: the very connection T1 ran on, idle in the pool, is back to the server's
    # setting.
    assert len(set(map(id, used))) == 1
    assert used[0].execute("SHOW synchronous_commit").fetchone()[0] == "on"
    used[0].rollback()
    with pg_engine.connect() as conn:
        t1_end = conn.exec_driver_sql("SELECT pg_current_wal_insert_lsn()").scalar_one()
    assert run.latest_attempt is not None
    JournalRepository(pg_engine).reserve(
        attempt_id=run.latest_attempt.id, run_id=run.id, receipt_ref="r", only_if_starting=True
    )
    # The reserve's COMMIT waited for its flush, which takes the WAL past T1's commit. (The
    # position read below alone could also pass on the WAL writer's own background flush.)
    assert at_commit == ["off", "off", "on"]  # T1, the lock statement's check above, the reserve
    with pg_engine.connect() as conn:
        covered = conn.execute(
            text("SELECT pg_current_wal_flush_lsn() >= CAST(:lsn AS pg_lsn)"), {"lsn": t1_end}
        ).scalar_one()
    assert covered  # the reserve's synced commit made T1 durable before any spawn
