"""Recovery: time for a freshly started worker to consume N pending receipts.

Prepared untimed: N runs in ``running`` with a ``spawned`` journal entry each, a handle whose
shim and job are a dead process (so the watcher and the reconciler see them exited), and a
valid receipt written with the real codec and the token whose digest T1 stored. Then
``python -m app worker`` is started and timed until every run is terminal. Baselines: the
same worker's start-up on the same database with nothing to recover (to its socket), and
the database's own commit rate for N transactions.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

from app.storage.engine import make_engine
from app.worker.receipts import ReceiptStore
from bench.report import Figure, Report
from bench.stack import database, start_worker, stop
from bench.trivial import POLL_NEAR_END_S, commit_rate, wait_terminal
from tests.worker.kit import dead_handle, running_run, write_receipt


def prepare(url: str, data: Path, count: int) -> None:
    """``count`` running attempts whose shims are gone and whose receipts wait on disk."""
    engine = make_engine(url)
    try:
        store = ReceiptStore(data / "receipts")
        store.ensure_root()
        handle = dead_handle()
        for _ in range(count):
            write_receipt(store, *running_run(engine, handle))
    finally:
        engine.dispose()


def run_recovery(report: Report, *, pg: str | None, count: int) -> None:
    """Add the recovery figure for one database."""
    label = "postgresql" if pg else "sqlite"
    tmp = Path(tempfile.mkdtemp(prefix="qlb"))
    data = tmp / "d"
    data.mkdir(mode=0o700)
    try:
        with database(pg, data) as url:
            t0 = time.perf_counter()
            idle = start_worker(data, url)
            idle_s = time.perf_counter() - t0
            stop(idle)
            prepare(url, data, count)
            engine = make_engine(url)
            try:
                t0 = time.perf_counter()
                worker = start_worker(data, url)
                try:
                    done = wait_terminal(engine, count, timeout_s=120, far_s=POLL_NEAR_END_S)
                    elapsed = time.perf_counter() - t0
                finally:
                    stop(worker)
                with engine.connect() as conn:
                    query = text("SELECT status, count(*) FROM runs GROUP BY status")
                    statuses: dict[str, int] = {r[0]: r[1] for r in conn.execute(query)}
            finally:
                engine.dispose()
            commits = commit_rate(url, count)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    extra = {"n": count, "all_terminal": done, "statuses": statuses}
    report.add(Figure(f"{label} recover {count} receipts (worker start->all terminal)", elapsed,
                      "s", "worker start-up, nothing to recover", idle_s, False,
                      target="<= 5 s" if pg is None else "", extra=extra))
    report.add(Figure(f"{label} recover {count} receipts", elapsed, "s",
                      f"{count} db commits", count / commits, False, extra=extra))
