"""SQLite group commit: write units of work that meet at the gate share one synced commit.

docs/design.md §5.3. What must hold, each on a real SQLite file:

* a member's ``commit()`` returns only after the group's COMMIT: until then its row is not
  visible on another connection, and nothing the caller does after ``commit()`` has run;
* a member that rolls back (an exception, a constraint) takes only its own writes;
* a shared commit that fails (a real full disk) fails every member, and keeps nothing;
* kill -9 while a group is open loses the whole group, and no member acted on its write;
* a group carries at most ``MAX_GROUP`` members; a write inside a write is refused.

The members are real threads; the tests read the gate's waiting count only to know that a
second writer is queued before the first commits (so a group forms every time).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.exc import IntegrityError

from app.domain.errors import StorageUnavailable
from app.storage import uow as uow_module
from app.storage.engine import make_engine
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.storage.uow import UnitOfWork, _writer_gate
from tests.disk import fill, mounted_tmpfs
from tests.storage.helpers import define_task

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 10.0


def _engine_at(path: Path) -> Engine:
    engine = make_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (v INTEGER UNIQUE, pad BLOB)"))
    return engine


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    engine = _engine_at(tmp_path / "group.db")
    yield engine
    engine.dispose()


def _visible(engine: Engine) -> list[int]:
    """The committed values, read on a connection of its own (not through the gate)."""
    path = engine.url.database
    assert path is not None
    conn = sqlite3.connect(path)
    try:
        return [row[0] for row in conn.execute("SELECT v FROM t ORDER BY v")]
    finally:
        conn.close()


def _until(check: Callable[[], bool], what: str, within_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _count_commits(engine: Engine) -> list[int]:
    """Appends, at every COMMIT, how many INSERTs the transaction carried."""
    sizes: list[int] = []
    inserts = [0]

    @event.listens_for(engine, "before_cursor_execute")
    def _seen(_c: Any, _cur: Any, statement: str, *_rest: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT"):
            inserts[0] += 1

    @event.listens_for(engine, "commit")
    def _committed(_conn: Any) -> None:
        sizes.append(inserts[0])
        inserts[0] = 0

    return sizes


def _insert(uow: UnitOfWork, value: int, pad: bytes = b"") -> None:
    uow.conn.execute(text("INSERT INTO t (v, pad) VALUES (:v, :p)"), {"v": value, "p": pad})


def _inserting(value: int) -> Callable[[UnitOfWork], None]:
    return lambda uow: _insert(uow, value)


def _held(engine: Engine) -> bool:
    """A member is running now (its thread holds the gate)."""
    gate = _writer_gate(engine)
    return gate is not None and gate.holder is not None


def _until_holding(engine: Engine, member: threading.Thread) -> None:
    """Wait until ``member`` runs its body. The gate is a plain lock, not a queue: a writer
    started earlier could take it first, and ``member`` would then wait for one that never
    comes."""
    gate = _writer_gate(engine)
    assert gate is not None
    _until(lambda: gate.holder == member.ident, "the member's body")


def _open_group(engine: Engine, first: _Member, second: threading.Thread) -> None:
    """Start ``first`` (which commits once a second writer waits), then ``second`` once
    ``first`` runs; return when ``first`` is in its ``commit()``: the group is open."""
    first.start()
    _until(lambda: _held(engine), "the first member's body")
    second.start()
    _until(first.committing.is_set, "the first member's commit()")


class _Member(threading.Thread):
    """One grouped write in its own thread: ``body(uow)``, then ``commit()`` (or, with
    ``commit=False``, leave the block without committing and without an error)."""

    def __init__(
        self, engine: Engine, body: Callable[[UnitOfWork], object], *, commit: bool = True
    ) -> None:
        super().__init__(daemon=True)
        self.engine, self.body, self.commit = engine, body, commit
        self.committing = threading.Event()
        self.returned = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with UnitOfWork(self.engine, grouped=True) as uow:
                self.body(uow)
                self.committing.set()
                if self.commit:
                    uow.commit()
            self.returned.set()
        except BaseException as exc:
            self.error = exc


def _first_waits_for_a_second(engine: Engine, value: int) -> _Member:
    """A member that writes ``value`` and commits only once another writer is queued."""
    gate = _writer_gate(engine)
    assert gate is not None

    def body(uow: UnitOfWork) -> None:
        _insert(uow, value)
        _until(lambda: gate.waiting > 0, "a second writer at the gate")

    return _Member(engine, body)


def test_writes_that_meet_at_the_gate_share_one_commit_and_return_after_it(
    sqlite_engine: Engine,
) -> None:
    commits = _count_commits(sqlite_engine)
    hold = threading.Event()
    first = _first_waits_for_a_second(sqlite_engine, 1)

    def second_body(uow: UnitOfWork) -> None:
        _insert(uow, 2)
        hold.wait(WAIT_S)

    second = _Member(sqlite_engine, second_body)
    _open_group(sqlite_engine, first, second)
    time.sleep(0.2)  # the second member is inside its body, holding the group open
    assert not first.returned.is_set()  # its commit() waits for the group's COMMIT
    assert _visible(sqlite_engine) == []  # and nothing is committed yet
    hold.set()
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert first.error is None and second.error is None
    assert first.returned.is_set() and second.returned.is_set()
    assert _visible(sqlite_engine) == [1, 2]
    assert commits == [2]  # one synced COMMIT carried both


def test_a_member_that_rolls_back_takes_only_its_own_writes(sqlite_engine: Engine) -> None:
    commits = _count_commits(sqlite_engine)
    first = _first_waits_for_a_second(sqlite_engine, 1)

    def failing(uow: UnitOfWork) -> None:
        _insert(uow, 2)
        raise ValueError("the caller's own refusal")

    second = _Member(sqlite_engine, failing)
    _open_group(sqlite_engine, first, second)
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert first.error is None and first.returned.is_set()
    assert isinstance(second.error, ValueError)
    assert _visible(sqlite_engine) == [1]
    assert commits == [2]  # the rolled-back insert was in the transaction, and undone


def test_a_member_refused_by_a_constraint_leaves_the_group_whole(sqlite_engine: Engine) -> None:
    commits = _count_commits(sqlite_engine)
    gate = _writer_gate(sqlite_engine)
    assert gate is not None
    first = _first_waits_for_a_second(sqlite_engine, 1)

    def duplicate_then_more(uow: UnitOfWork) -> None:
        _insert(uow, 3)
        _until(lambda: gate.waiting > 0, "the third writer at the gate")
        _insert(uow, 1)  # the first member's uncommitted value: UNIQUE refuses it

    second = _Member(sqlite_engine, duplicate_then_more)
    third = _Member(sqlite_engine, lambda uow: _insert(uow, 4))
    _open_group(sqlite_engine, first, second)
    _until_holding(sqlite_engine, second)
    third.start()
    for member in (first, second, third):
        member.join(WAIT_S)
    assert isinstance(second.error, IntegrityError)
    assert first.error is None and third.error is None
    assert _visible(sqlite_engine) == [1, 4]  # 3 went with its member's rollback
    assert commits == [4]  # one COMMIT: the refused member did not end the group


def test_a_member_that_decided_on_uncommitted_writes_returns_only_after_the_commit(
    sqlite_engine: Engine,
) -> None:
    # The second member reads the first's uncommitted row and leaves without committing
    # (a replayed key, an ending already recorded): what it answers rests on that row, so it
    # must not return while a third member still holds the group open.
    gate = _writer_gate(sqlite_engine)
    assert gate is not None
    hold = threading.Event()
    first = _first_waits_for_a_second(sqlite_engine, 1)
    seen: list[int] = []

    def read(uow: UnitOfWork) -> None:
        seen.extend(v for (v,) in uow.conn.execute(text("SELECT v FROM t")))
        _until(lambda: gate.waiting > 0, "the third writer at the gate")

    def third_body(uow: UnitOfWork) -> None:
        _insert(uow, 3)
        hold.wait(WAIT_S)

    reader = _Member(sqlite_engine, read, commit=False)
    third = _Member(sqlite_engine, third_body)
    _open_group(sqlite_engine, first, reader)
    _until(lambda: seen == [1], "the reader's read of the uncommitted row")
    third.start()
    _until(lambda: third.committing.is_set() or gate.waiting == 0, "the third member")
    time.sleep(0.2)
    assert not reader.returned.is_set()  # it waits for the group, as the committers do
    assert _visible(sqlite_engine) == []
    hold.set()
    for member in (first, reader, third):
        member.join(WAIT_S)
    assert reader.error is None and reader.returned.is_set()
    assert _visible(sqlite_engine) == [1, 3]


def test_members_that_roll_back_count_toward_the_bound(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stream of members that never commit (a 429 flood, replays) must not keep a group,
    # and SQLite's write lock, open past the bound.
    monkeypatch.setattr(uow_module, "MAX_GROUP", 2)
    commits = _count_commits(sqlite_engine)
    gate = _writer_gate(sqlite_engine)
    assert gate is not None
    first = _first_waits_for_a_second(sqlite_engine, 0)

    def refused(uow: UnitOfWork) -> None:
        _insert(uow, 1)
        _until(lambda: gate.waiting >= 2, "two more writers at the gate")
        raise ValueError("refused")

    second = _Member(sqlite_engine, refused)
    rest = [_Member(sqlite_engine, _inserting(v)) for v in (2, 3)]
    _open_group(sqlite_engine, first, second)
    _until_holding(sqlite_engine, second)
    for member in rest:
        member.start()
    for member in (first, second, *rest):
        member.join(WAIT_S)
    assert isinstance(second.error, ValueError)
    assert _visible(sqlite_engine) == [0, 2, 3]
    assert commits == [2, 2]  # the refused member closed the first group (it ran in it)


def test_a_group_never_carries_more_than_max_group(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(uow_module, "MAX_GROUP", 3)
    commits = _count_commits(sqlite_engine)
    gate = _writer_gate(sqlite_engine)
    assert gate is not None

    def first_body(uow: UnitOfWork) -> None:
        _insert(uow, 0)
        _until(lambda: gate.waiting >= 7, "seven writers at the gate")

    members = [_Member(sqlite_engine, first_body)]
    members += [_Member(sqlite_engine, _inserting(v)) for v in range(1, 8)]
    members[0].start()
    _until(lambda: gate.holder is not None, "the first member's body")
    for member in members[1:]:
        member.start()
    for member in members:
        member.join(WAIT_S)
    assert all(m.error is None and m.returned.is_set() for m in members)
    assert _visible(sqlite_engine) == list(range(8))
    assert sum(commits) == 8
    assert max(commits) == 3  # groups formed, none past the bound


def test_a_write_inside_a_write_on_one_thread_is_refused(sqlite_engine: Engine) -> None:
    with UnitOfWork(sqlite_engine, grouped=True) as outer:
        _insert(outer, 1)
        with pytest.raises(RuntimeError, match="inside another"), UnitOfWork(sqlite_engine):
            pass
        outer.commit()
    with UnitOfWork(sqlite_engine) as after:  # the gate was handed on
        _insert(after, 2)
        after.commit()
    assert _visible(sqlite_engine) == [1, 2]


def test_a_shared_commit_that_fails_on_a_full_disk_fails_every_member(tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "disk", size_mib=8) as disk:
        engine = _engine_at(disk / "group.db")
        try:
            with UnitOfWork(engine) as uow:  # the WAL holds a few pages already
                _insert(uow, 0)
                uow.commit()
            filler = fill(disk, leave_bytes=64 * 1024)
            pad = os.urandom(256 * 1024)  # each member's pages only fit in the page cache
            first = _first_waits_for_a_second(engine, 1)
            first.body = _padded(first.body, pad)
            gate = _writer_gate(engine)
            assert gate is not None

            def second_body(uow: UnitOfWork) -> None:
                _insert(uow, 2, pad)
                _until(lambda: gate.waiting > 0, "the reader at the gate")

            second = _Member(engine, second_body)
            # A member that only reads what the others wrote and leaves without commit():
            # the failed commit takes what it read, so it fails too.
            reader = _Member(engine, _read_all, commit=False)
            _open_group(engine, first, second)
            _until_holding(engine, second)
            reader.start()
            for member in (first, second, reader):
                member.join(WAIT_S)
            assert isinstance(first.error, StorageUnavailable), first.error
            assert isinstance(second.error, StorageUnavailable), second.error
            assert isinstance(reader.error, StorageUnavailable), reader.error
            assert not first.returned.is_set() and not second.returned.is_set()
            assert _visible(engine) == [0]  # nothing of the group was kept
            filler.unlink()
            with UnitOfWork(engine, grouped=True) as uow:  # the gate and the file recovered
                _insert(uow, 3, pad)
                uow.commit()
            assert _visible(engine) == [0, 3]
        finally:
            engine.dispose()


def _read_all(uow: UnitOfWork) -> object:
    return uow.conn.execute(text("SELECT v FROM t")).all()


def _padded(body: Callable[[UnitOfWork], object], pad: bytes) -> Callable[[UnitOfWork], None]:
    def with_pad(uow: UnitOfWork) -> None:
        uow.conn.execute(text("INSERT INTO t (v, pad) VALUES (-1, :p)"), {"p": pad})
        body(uow)

    return with_pad


_CRASH_CHILD = textwrap.dedent(
    """
    import sys, threading, time
    from pathlib import Path
    from sqlalchemy import text
    from app.storage.engine import make_engine
    from app.storage.uow import UnitOfWork, _writer_gate

    db, marks = Path(sys.argv[1]), Path(sys.argv[2])
    engine = make_engine(f"sqlite:///{db}")
    gate = _writer_gate(engine)
    insert = text("INSERT INTO t (v) VALUES (:v)")

    def first():
        with UnitOfWork(engine, grouped=True) as uow:
            uow.conn.execute(insert, {"v": 1})
            while gate.waiting == 0:
                time.sleep(0.001)
            (marks / "first-committing").touch()
            uow.commit()
        (marks / "first-acted").touch()  # what a caller does once its write is durable

    def second():
        with UnitOfWork(engine, grouped=True) as uow:
            uow.conn.execute(insert, {"v": 2})
            (marks / "second-in-body").touch()
            time.sleep(3600)

    threading.Thread(target=first, daemon=True).start()
    while gate.holder is None:
        time.sleep(0.001)
    threading.Thread(target=second, daemon=True).start()
    time.sleep(3600)
    """
)


def test_kill_9_while_a_group_is_open_loses_it_whole_and_no_member_acted(
    sqlite_engine: Engine, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    db = sqlite_engine.url.database
    assert db is not None
    child = subprocess.Popen(
        [sys.executable, "-c", _CRASH_CHILD, db, str(marks)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        # A child interpreter imports the app first: generous on a loaded CI machine.
        _until(lambda: (marks / "second-in-body").exists(), "the second member's body", 60.0)
        assert (marks / "first-committing").exists()
        time.sleep(0.1)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(WAIT_S)
    assert not (marks / "first-acted").exists()  # its commit() never returned
    assert _visible(sqlite_engine) == []  # the group's writes went with the process
    with UnitOfWork(sqlite_engine, grouped=True) as uow:  # the lock died with it
        _insert(uow, 5)
        uow.commit()
    assert _visible(sqlite_engine) == [5]


def test_enqueues_from_many_threads_all_land_with_their_events(engine: Engine) -> None:
    """The grouped enqueue on both engines (PostgreSQL has no gate: each commits alone)."""
    define_task(engine)
    runs = RunRepository(engine)
    ids: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def enqueue_some() -> None:
        try:
            for _ in range(10):
                run, created = runs.enqueue_run(task="job", revision=None, priority=None)
                assert created
                with lock:
                    ids.append(run.id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=enqueue_some) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(set(ids)) == 80
    reader = RunReader(engine)
    for run_id in ids:
        run = reader.get_run(run_id)
        assert run.status == "queued"
    with engine.connect() as conn:
        queued_events = conn.execute(
            text("SELECT count(*) FROM run_events WHERE type = 'run.queued'")
        ).scalar_one()
    assert queued_events == 80
