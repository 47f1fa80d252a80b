"""SQLite writers wait for the write lock (polling) and still give up after the timeout.

How soon a waiter gets a freed lock is a speed figure: bench/trivial.py measures it.

The lock is held by a second, independent connection (as another process would hold it):
the unit of work's in-process gate does not see it, only SQLite's lock does.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from app.domain.errors import DatabaseBusy
from app.storage import engine as engine_module
from app.storage.engine import make_engine
from app.storage.uow import UnitOfWork


def _holder(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")
    return conn


def _write(engine_url: str, value: int) -> None:
    engine = make_engine(engine_url)
    try:
        with UnitOfWork(engine) as uow:
            uow.conn.execute(text("INSERT INTO t (v) VALUES (:v)"), {"v": value})
            uow.commit()
    finally:
        engine.dispose()


@pytest.fixture
def db(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "lock.db"
    url = f"sqlite:///{path}"
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (v INTEGER)"))
    engine.dispose()
    return path, url


def test_a_writer_waits_for_another_connections_lock_then_writes_after_it(
    db: tuple[Path, str],
) -> None:
    path, url = db
    holder = _holder(path)
    released_at: list[float] = []

    def release() -> None:
        time.sleep(0.2)
        holder.execute("INSERT INTO t (v) VALUES (1)")
        released_at.append(time.monotonic())
        holder.execute("COMMIT")

    thread = threading.Thread(target=release)
    thread.start()
    _write(url, 2)
    done = time.monotonic()
    thread.join()
    holder.close()
    assert done > released_at[0]  # it really waited for the other connection
    # Both rows, in lock order: the waiter wrote after the holder committed.
    check = sqlite3.connect(path)
    assert [r[0] for r in check.execute("SELECT v FROM t ORDER BY rowid")] == [1, 2]
    # Busy timeout restored after the polling BEGIN.
    engine = make_engine(url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one() == 10_000
    engine.dispose()
    check.close()


def test_a_writer_gives_up_with_the_database_error_after_the_timeout(
    db: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, url = db
    monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 300)
    holder = _holder(path)
    try:
        t0 = time.monotonic()
        with pytest.raises(DatabaseBusy) as busy:  # the api answers it 503 DATABASE_BUSY
            _write(url, 3)
        assert isinstance(busy.value.__cause__, sqlite3.OperationalError)
        assert "locked" in str(busy.value.__cause__)
        waited = time.monotonic() - t0
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert 0.3 <= waited < 5.0
    check = sqlite3.connect(path)
    assert list(check.execute("SELECT v FROM t")) == []  # nothing half-written
    check.close()
