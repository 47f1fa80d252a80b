"""Bulk seeding for the retention tests and bench: finished runs with real, tiny log files.

Rows go in with one executemany per table (10,000 runs in about a second on SQLite), files
are written straight into ``logs/<shard>/<attempt>.log`` as the shim would leave them.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, func, select

from app.domain.artifacts import log_relpath
from app.domain.ids import uuid7
from app.storage.definitions_repo import DefinitionRepository
from app.storage.tables import attempts, receipt_journal, run_events, runs

DAY_MS = 86_400_000


@dataclass(frozen=True)
class Seeded:
    task: str
    run_id: str
    attempt_id: str


def define(engine: Engine, task: str) -> None:
    """One revision of ``task`` (ignored if it exists)."""
    DefinitionRepository(engine).put_revision(
        task=task,
        revision=1,
        executor="local_process",
        argv=["/bin/true"],
        cwd=None,
        recipe=None,
        timeout_seconds=None,
        priority=0,
    )


def seed(
    engine: Engine,
    logs_root: Path | None,
    *,
    tasks: Iterable[str],
    runs_per_task: int,
    log_bytes: int = 10,
    start_ms: int,
    status: str = "succeeded",
    journal: str | None = None,
) -> list[Seeded]:
    """``runs_per_task`` finished runs per task, one ms apart, oldest first, with logs."""
    out: list[Seeded] = []
    run_rows, attempt_rows, event_rows, journal_rows = [], [], [], []
    at = start_ms
    body = b"x" * log_bytes
    shards: set[Path] = set()
    for task in tasks:
        define(engine, task)
        for _ in range(runs_per_task):
            at += 1
            run_id, attempt_id = uuid7(at), uuid7(at)
            out.append(Seeded(task, run_id, attempt_id))
            run_rows.append(
                {
                    "id": run_id, "task": task, "revision": 1, "status": status, "priority": 0,
                    "version": 2, "latest_attempt": 1, "created_at_ms": at,
                    "started_at_ms": at, "finished_at_ms": at, "trigger_kind": "manual",
                    "pinned": False,
                }
            )  # fmt: skip
            attempt_rows.append(
                {
                    "id": attempt_id, "run_id": run_id, "number": 1, "status": status,
                    "executor": "local_process", "created_at_ms": at, "started_at_ms": at,
                    "finished_at_ms": at, "exit_code": 0, "callback_sequence": 1,
                    "log_artifact_id": "log:" + attempt_id, "log_bytes": log_bytes,
                    "log_truncated": False, "log_dropped_bytes": 0,
                }
            )  # fmt: skip
            event_rows += [
                {"run_id": run_id, "seq": 1, "type": "run.queued", "at_ms": at, "data": "{}"},
                {"run_id": run_id, "seq": 2, "type": "run.succeeded", "at_ms": at, "data": "{}"},
            ]
            if journal is not None:
                journal_rows.append(
                    {
                        "attempt_id": attempt_id, "run_id": run_id, "state": journal,
                        "receipt_ref": "x", "created_at_ms": at, "updated_at_ms": at,
                    }
                )  # fmt: skip
            if logs_root is not None:
                path = logs_root / log_relpath(attempt_id)
                if path.parent not in shards:
                    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                    shards.add(path.parent)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.write(fd, body)
                finally:
                    os.close(fd)
    with engine.begin() as conn:
        mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
        for table, rows in (
            (runs, run_rows),
            (attempts, attempt_rows),
            (run_events, event_rows),
            (receipt_journal, journal_rows),
        ):
            if not rows:
                continue
            # The driver's executemany on plain tuples: SQLAlchemy's per-row parameter
            # processing cost more than the inserts themselves.
            names = list(rows[0])
            sql = (
                f"INSERT INTO {table.name} ({', '.join(names)}) "
                f"VALUES ({', '.join([mark] * len(names))})"
            )
            conn.exec_driver_sql(sql, [tuple(r[n] for n in names) for r in rows])
    return out


@contextlib.contextmanager
def fast_fs(path: Path, *, size_mib: int = 200) -> Iterator[Path]:
    """A tmpfs at ``path`` where mounting is permitted (creating 10,000 files on the shared
    host's disk took 20 s), else the plain directory; unmounted afterwards."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(path)],
        capture_output=True,
    )
    if done.returncode != 0:
        yield path
        return
    try:
        yield path
    finally:
        for _ in range(50):
            if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            subprocess.run(["umount", str(path)], check=True)


def file_and_row_agree(engine: Engine, logs_root: Path) -> tuple[list[str], list[str]]:
    """(attempts whose row says the log is there but the file is gone, files with no row that
    names them as there), found by listing the logs root: what a crash must never leave."""
    with engine.connect() as conn:
        rows = conn.execute(select(attempts.c.id, attempts.c.log_state)).all()
    state = {r.id: r.log_state for r in rows}
    on_disk = {
        p.name.removesuffix(".log")
        for shard in logs_root.iterdir()
        if shard.is_dir()
        for p in shard.iterdir()
        if p.name.endswith(".log")
    }
    dangling = sorted(a for a, s in state.items() if s is None and a not in on_disk)
    orphans = sorted(a for a in on_disk if a not in state or state[a] == "expired")
    return dangling, orphans


def counts(engine: Engine) -> dict[str, int]:
    """Attempts by log state (``present`` for NULL) and runs."""
    with engine.connect() as conn:
        by_state = {
            state or "present": n
            for state, n in conn.execute(
                select(attempts.c.log_state, func.count()).group_by(attempts.c.log_state)
            ).all()
        }
        by_state["runs"] = conn.execute(select(func.count()).select_from(runs)).scalar() or 0
    return {str(k): int(v) for k, v in by_state.items()}
