"""Retention (docs/retention.md): the sweep's cost per 1,000 expired logs beside plain
``unlink`` of 1,000 files on the same file system, and a list page at many runs while the
sweep works beside the same page with retention off. SQLite, in a temporary directory.

The sweep's figure covers everything a pass does for those logs: the database reads (anchors,
candidates), the two marks, the unlinks (log, fact, fact temp), one fsync per shard touched,
the deletion of rows past the row budget and the sweep record. The list figure seeds rows
without files (creating 100,000 files would measure the disk, not the list): the sweep then
does the same database work and its unlinks find nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.domain.ids import now_ms, uuid7
from app.domain.profiles import STANDALONE
from app.domain.retention import GlobalBudgets, RetentionPolicy
from app.storage.engine import make_engine
from app.storage.migrate import upgrade_to_head
from app.storage.retention_repo import RetentionRepository
from app.storage.run_reads import RunReader
from app.worker.log_retention import LogSweep
from bench.report import Figure, Report, median
from tests.storage.retention_kit import DAY_MS, seed

KEEP = 10
_SWEEP_LOOP = """
import sys
from pathlib import Path
from bench.retention import _sweep
sweep = _sweep(sys.argv[1], Path(sys.argv[2]), tasks=20)
print("started", flush=True)
while True:
    sweep.run_pass()
"""


def _sweep(engine_url: str, root: Path, *, tasks: int = 10) -> LogSweep:
    engine = make_engine(engine_url)
    return LogSweep(
        repo=RetentionRepository(engine),
        logs_root=root,
        policy=RetentionPolicy(
            keep_runs=KEEP, keep_days=0, keep_rows=KEEP * 2, task_log_bytes=None
        ),
        budgets=GlobalBudgets(total_log_bytes=None, free_reserve_bytes=0),
        tasks_per_pass=tasks,
        files_per_pass=STANDALONE.retention.files_per_pass,
    )


def _sweep_figure(report: Report, tmp: Path, expired: int) -> None:
    url = f"sqlite:///{tmp / 'sweep.db'}"
    engine = make_engine(url)
    upgrade_to_head(engine)
    root = tmp / "logs"
    seed(engine, root, tasks=["t"], runs_per_task=expired + KEEP, start_ms=now_ms() - DAY_MS)
    sweep = _sweep(url, root, tasks=1)
    t0 = time.perf_counter()
    done = 0
    while True:
        r = sweep.run_pass()
        done += r.expired_logs
        if not (r.expired_logs or r.deleted_runs):
            break
    sweep_s = time.perf_counter() - t0
    assert done == expired, (done, expired)
    # The baseline: the same number of files, sharded alike, created then unlinked.
    base = tmp / "plain"
    names = []
    for _ in range(expired):
        a = uuid7()
        d = base / a[-2:]
        d.mkdir(parents=True, exist_ok=True)
        path = str(d / f"{a}.log")
        with open(path, "wb") as f:
            f.write(b"x" * 10)
        names.append(path)
    t0 = time.perf_counter()
    for path in names:
        os.unlink(path)
    unlink_s = time.perf_counter() - t0
    # What the durable order adds on top: one fsync per shard the unlinks touched.
    t0 = time.perf_counter()
    for shard in sorted({os.path.dirname(p) for p in names}):
        fd = os.open(shard, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)
        os.close(fd)
    fsync_ms = (time.perf_counter() - t0) * 1000
    engine.dispose()
    per_k = 1000 / expired
    report.add(
        Figure(
            name="retention sweep per 1,000 expired logs",
            value=sweep_s * per_k * 1000,
            unit="ms",
            baseline_name="unlink of 1,000 files",
            baseline=unlink_s * per_k * 1000,
            higher_is_better=False,
            extra={
                "expired": expired,
                "files_per_pass": STANDALONE.retention.files_per_pass,
                "fsync": "one per shard touched per pass",
                "fsync_of_those_shards_ms": fsync_ms,
            },
        )
    )


def _list_figure(report: Report, tmp: Path, runs: int, repeats: int) -> None:
    url = f"sqlite:///{tmp / 'list.db'}"
    engine = make_engine(url)
    upgrade_to_head(engine)
    tasks = [f"task-{i}" for i in range(20)]
    seed(engine, None, tasks=tasks, runs_per_task=runs // 20, start_ms=now_ms() - DAY_MS)
    reader = RunReader(engine)

    def page_ms() -> float:
        t0 = time.perf_counter()
        reader.list_runs(task=None, status=None, limit=50, cursor=None)
        return (time.perf_counter() - t0) * 1000

    off = median([page_ms() for _ in range(repeats)])
    # The sweep in a process of its own, as in the service (the worker runs it, the api lists).
    child = subprocess.Popen(
        [sys.executable, "-c", _SWEEP_LOOP, url, str(tmp / "no-logs")],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert child.stdout is not None
        child.stdout.readline()  # "started": its first pass is under way
        on = median([page_ms() for _ in range(repeats)])
    finally:
        child.kill()
        child.wait(30)
        if child.stdout is not None:
            child.stdout.close()
    engine.dispose()
    report.add(
        Figure(
            name=f"list page 1 @{runs // 1000}k runs, sweep running",
            value=on,
            unit="ms",
            baseline_name="same, retention off",
            baseline=off,
            higher_is_better=False,
            target="ratio <= 2",
        )
    )


def run_retention(report: Report, *, expired: int, list_runs: int, repeats: int) -> None:
    """Both figures, each in its own temporary directory."""
    with tempfile.TemporaryDirectory(prefix="ql-bench-retention-") as tmp:
        _sweep_figure(report, Path(tmp), expired)
    with tempfile.TemporaryDirectory(prefix="ql-bench-retention-") as tmp:
        _list_figure(report, Path(tmp), list_runs, repeats)
