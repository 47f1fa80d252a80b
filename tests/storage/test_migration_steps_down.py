"""Every migration's step down runs on a database with rows, then `qinglong migrate` brings
it back: the way docs/operations.md §4 rolls back to an older build, on both engines.

SQLite enforces foreign keys on every connection (app/storage/engine.py), and a step down
that drops a column rebuilds its table (Alembic's batch mode: copy, DROP, rename). Before,
dropping ``runs`` while ``attempts`` pointed at it failed (``FOREIGN KEY constraint
failed``), so no step below 0007 could be taken on a database that had ever run a job.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from sqlalchemy import Engine

from app.storage.engine import make_engine
from app.storage.migrate import current_revision, head_revision, upgrade_to_head
from tests.storage.helpers import define_task, enqueue, start
from tests.storage.test_upgrade_from_0004 import empty_engine

__all__ = ["empty_engine"]  # the fixture, on a fresh SQLite file or a private PG schema

ROOT = Path(__file__).resolve().parents[2]  # alembic.ini: the steps down run from a checkout


def _run(args: list[str], url: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")}
    # A data dir of the test's: `migrate` makes it, and the default is ./.qinglong.
    env |= {"QL_DATABASE_URL": url, "QL_DATA_DIR": str(data_dir / "data")}
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def _counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: conn.exec_driver_sql(f"SELECT count(*) FROM {t}").scalar_one()
                for t in ("task_revisions", "runs", "attempts", "run_events")}  # fmt: skip


def test_each_step_down_keeps_the_rows_and_migrate_brings_the_database_back(
    empty_engine: Engine, tmp_path: Path,
) -> None:  # fmt: skip
    engine = empty_engine
    url = engine.url.render_as_string(hide_password=False)
    upgrade_to_head(engine)
    define_task(engine)
    start(engine, enqueue(engine))  # a running run: an attempt points at it
    enqueue(engine)
    before = _counts(engine)
    engine.dispose()  # the steps down take the tables a pooled connection would hold
    alembic = str(Path(sys.executable).with_name("alembic"))
    down = _run([alembic, "downgrade", "0001"], url, tmp_path)
    assert down.returncode == 0, down.stderr[-2000:]
    assert _counts(engine) == before
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").all() == [("0001",)]
        if engine.dialect.name == "sqlite":
            assert conn.exec_driver_sql("PRAGMA foreign_key_check").all() == []
    engine.dispose()
    up = _run([sys.executable, "-m", "app", "migrate"], url, tmp_path)
    assert up.returncode == 0, up.stderr
    assert up.stdout == f"database migrated to head ({head_revision()})\n"
    assert _counts(engine) == before


def test_a_failed_foreign_key_check_leaves_the_database_at_its_revision(tmp_path: Path) -> None:
    """The check runs after the steps, with SQLite's foreign keys off: Alembic committed each
    step alone on SQLite, so a failed check rolled nothing back, `migrate` ended in a
    traceback, and the next `migrate` said 'migrated to head' over the broken row. Now the
    steps and the check are one transaction, and the refusal is one line."""
    db = tmp_path / "q.db"
    url = f"sqlite:///{db}"
    assert _run([sys.executable, "-m", "alembic", "upgrade", "0011"], url, tmp_path).returncode == 0
    with sqlite3.connect(db) as raw:  # a row no run holds, as a hand edit would leave
        raw.execute("PRAGMA foreign_keys=OFF")
        raw.execute("INSERT INTO run_events VALUES ('no-such-run', 1, 'run.queued', 0, '{}')")
    for _ in range(2):  # refused again: never 'migrated' over the broken row
        done = _run([sys.executable, "-m", "app", "migrate"], url, tmp_path)
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stderr.splitlines() == [
            "qinglong: a row of run_events points at no row of runs (rows an older build or a "
            "hand edit left): nothing was migrated, the database stays at its revision; see "
            "`PRAGMA foreign_key_check` in sqlite3, repair or remove those rows, then migrate "
            "again"
        ]
        engine = make_engine(url)
        try:
            assert current_revision(engine) == "0011"
        finally:
            engine.dispose()
