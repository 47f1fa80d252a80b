"""A ``qinglong migrate`` SIGKILLed between two of its steps leaves the database at the
revision it started from, with every row, and the next ``migrate`` reaches head: on SQLite and
on PostgreSQL (docs/operations.md §4).

Every step of one ``migrate`` and the foreign-key check after them are one transaction
(app/storage/migrations/env.py); the kill comes after four steps were applied and written to
``alembic_version`` inside it (``crash_migrate.py``), so a database that kept any of them
would be at 0008 here, not 0004.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import Engine

from app.storage.migrate import current_revision, head_revision
from tests.storage.test_migration_steps_down import ROOT, _counts
from tests.storage.test_upgrade_from_0004 import _fill_0004, empty_engine, migrate_to
from tests.worker.kit import Worker

__all__ = ["empty_engine"]  # the fixture, on a fresh SQLite file or a private PG schema


def test_a_migrate_killed_between_its_steps_leaves_the_old_revision_and_the_next_one_finishes(
    empty_engine: Engine, tmp_path: Path, short_dir: Path,
) -> None:  # fmt: skip
    engine = empty_engine
    url = engine.url.render_as_string(hide_password=False)
    migrate_to(engine, "0004")
    _fill_0004(engine)  # a queued, a running and a succeeded run, their events and journal
    before = _counts(engine)
    engine.dispose()
    mark = tmp_path / "halted"
    data_dir = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    env |= {"QL_DATABASE_URL": url, "QL_DATA_DIR": str(data_dir)}
    crash = {"QLTEST_CRASH_AFTER": "0008", "QLTEST_CRASH_MARK": str(mark)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.storage.crash_migrate", "migrate"], cwd=ROOT,
        env=env | crash, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not mark.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "migrate never reached the step"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    assert current_revision(engine) == "0004"
    assert _counts(engine) == before
    if engine.dialect.name == "sqlite":
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA integrity_check").all() == [("ok",)]
    engine.dispose()

    again = subprocess.run(
        [sys.executable, "-m", "app", "migrate"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout == f"database migrated to head ({head_revision()})\n"
    assert _counts(engine) == before
    engine.dispose()
    worker = Worker(data_dir, url, short_dir / "w.sock")  # refuses a database not at head
    try:
        worker.start()
        assert worker.signal(signal.SIGTERM) == 0, worker.stderr()
    finally:
        worker.close()
