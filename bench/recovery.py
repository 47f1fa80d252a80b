"""Recovery: time for a freshly started worker to consume N pending receipts.

Prepared untimed: N runs in ``running`` with a ``spawned`` journal entry each, a handle whose
shim and job are a dead process (so the watcher and the reconciler see them exited), and a
valid receipt written with the real codec and the token whose digest T1 stored. Then
``python -m app worker`` is started and timed until every run is terminal. Baselines: the
same worker's start-up on the same database with nothing to recover (to its socket), and
the database's own commit rate for N transactions.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

from app.domain.artifacts import log_artifact_id
from app.domain.canonical import sha256_digest
from app.domain.ids import now_ms
from app.domain.model import ProcessHandle
from app.domain.receipt import Receipt, encode_receipt
from app.domain.tokens import new_callback_token
from app.storage.definitions_repo import DefinitionRepository
from app.storage.engine import make_engine
from app.storage.journal_repo import JournalRepository
from app.storage.runs_repo import RunRepository
from app.worker.identity import current_boot_id, read_identity
from app.worker.receipts import ReceiptStore
from bench.report import Figure, Report
from bench.stack import database, start_worker, stop
from bench.trivial import commit_rate, wait_terminal


def _dead_handle() -> ProcessHandle:
    pid = os.posix_spawn("/bin/sleep", ["/bin/sleep", "10"], {})
    ident = read_identity(pid)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    assert ident is not None
    return ProcessHandle(boot_id=current_boot_id(), pid=pid, pgid=pid,
                         start_ticks=ident.start_ticks, shim_pid=pid,
                         shim_start_ticks=ident.start_ticks)  # fmt: skip


def prepare(url: str, data: Path, count: int) -> None:
    """``count`` running attempts whose shims are gone and whose receipts wait on disk."""
    engine = make_engine(url)
    try:
        DefinitionRepository(engine).put_revision(
            task="true", revision=1, executor="local_process", argv=["/bin/true"],
            cwd=None, recipe=None, timeout_seconds=None, priority=0,
        )  # fmt: skip
        runs, journal = RunRepository(engine), JournalRepository(engine)
        store = ReceiptStore(data / "receipts")
        store.ensure_root()
        handle = _dead_handle()
        for _ in range(count):
            run, _ = runs.enqueue_run(task="true", revision=None, priority=None)
            assert run.latest_attempt is not None
            attempt = run.latest_attempt.id
            token = new_callback_token()
            runs.begin_dispatch(
                run_id=run.id, attempt_id=attempt, expected_version=None,
                token_digest=sha256_digest(token.encode("utf-8")), deadline_at_ms=None,
                log_artifact_id=log_artifact_id(attempt),
            )  # fmt: skip
            journal.reserve(attempt_id=attempt, run_id=run.id, receipt_ref="bench")
            journal.record_spawned(attempt_id=attempt, handle=handle)
            started = now_ms()
            runs.record_running(run_id=run.id, attempt_id=attempt, handle=handle,
                                started_at_ms=started)  # fmt: skip
            store.ensure_shard(attempt)
            body = encode_receipt(Receipt(run.id, attempt, 1, token, started, started + 1, 0))
            path = store.path_of(attempt)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, body)
            finally:
                os.close(fd)
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
                    done = wait_terminal(engine, count, timeout_s=120)
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
