"""Builders and process hygiene for the worker tests (real databases, processes, files)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import Engine

from app.adapters.worker_client import WorkerClient
from app.domain.artifacts import log_artifact_id, log_relpath, receipt_relpath
from app.domain.canonical import sha256_digest
from app.domain.errors import WorkerUnavailable
from app.domain.execution import LaunchRequest, Leftovers
from app.domain.ids import now_ms
from app.domain.model import ProcessHandle, RunEvent
from app.domain.receipt import Receipt, encode_receipt
from app.domain.retry import RetryPolicy
from app.domain.tokens import new_callback_token
from app.storage.definitions_repo import DefinitionRepository
from app.storage.journal_repo import JournalRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.worker.identity import current_boot_id, read_identity
from app.worker.receipts import ReceiptStore

# Moved to the shared kit (every process-starting tier uses them); importable here as before.
from tests.kit.processes import Processes as Processes
from tests.kit.processes import kill_exact as kill_exact
from tests.kit.processes import wait_all_threads_stopped

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 30.0
TERMINAL = {"succeeded", "failed", "cancelled", "timed_out", "lost"}

TERMINAL_EVENTS = frozenset(
    f"{kind}.{state}"
    for kind in ("run", "attempt")
    for state in TERMINAL
)


@dataclass(frozen=True)
class Armed:
    """A run armed by T1 (dispatching/starting) with its plaintext callback token."""

    run_id: str
    attempt_id: str
    token: str


def armed_run(engine: Engine, *, task: str = "job", retry: RetryPolicy | None = None) -> Armed:
    """Enqueue a run of a local_process task (with ``retry``, its revision's retry policy)
    and arm it with begin_dispatch (T1)."""
    defs = DefinitionRepository(engine)
    defs.put_revision(
        task=task, revision=1, executor="local_process", argv=["true"], cwd=None,
        recipe=None, timeout_seconds=None, priority=0, retry=retry,
    )
    runs = RunRepository(engine)
    run, _ = runs.enqueue_run(task=task, revision=1, priority=None)
    assert run.latest_attempt is not None
    attempt_id = run.latest_attempt.id
    token = new_callback_token()
    runs.begin_dispatch(
        run_id=run.id,
        attempt_id=attempt_id,
        expected_version=None,
        token_digest=sha256_digest(token.encode("utf-8")),
        deadline_at_ms=None,
        log_artifact_id=log_artifact_id(attempt_id),
    )
    return Armed(run.id, attempt_id, token)


def dead_handle() -> ProcessHandle:
    """The identity of a process that existed and is gone (reaped): a shim that exited."""
    pid = os.posix_spawn("/bin/sleep", ["/bin/sleep", "10"], {})
    ident = read_identity(pid)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert ident is not None
    return ProcessHandle(
        boot_id=current_boot_id(), pid=pid, pgid=pid, start_ticks=ident.start_ticks,
        shim_pid=pid, shim_start_ticks=ident.start_ticks,
    )  # fmt: skip


def running_run(engine: Engine, handle: ProcessHandle) -> tuple[Armed, int]:
    """``armed_run``, journaled as spawned with ``handle`` and recorded running (T2) as the
    launcher and the coordinator would; (armed, started_at_ms)."""
    armed = armed_run(engine)
    journal = JournalRepository(engine)
    journal.reserve(
        attempt_id=armed.attempt_id, run_id=armed.run_id,
        receipt_ref=receipt_relpath(armed.attempt_id),
    )  # fmt: skip
    journal.record_spawned(attempt_id=armed.attempt_id, handle=handle)
    started = now_ms()
    RunRepository(engine).record_running(
        run_id=armed.run_id, attempt_id=armed.attempt_id, handle=handle, started_at_ms=started
    )
    return armed, started


def write_receipt(store: ReceiptStore, armed: Armed, started_at_ms: int) -> Receipt:
    """Put the success receipt a shim would publish for ``armed`` in its place (no fsync)."""
    receipt = Receipt(
        armed.run_id, armed.attempt_id, 1, armed.token, started_at_ms, started_at_ms + 1, 0
    )
    store.ensure_shard(armed.attempt_id)
    path = store.path_of(armed.attempt_id)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, encode_receipt(receipt))
    finally:
        os.close(fd)
    return receipt


def make_log(logs_dir: Path, attempt_id: str) -> Path:
    """Create the attempt's log file as the materializer does (0700 dirs, 0600 file)."""
    path = logs_dir / log_relpath(attempt_id)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.close(fd)
    return path


def launch_request(
    armed: Armed,
    *,
    argv: list[str],
    log_path: Path,
    cwd: str | None = None,
    quota: int = 1 << 20,
    leftovers: Leftovers = "kill",
) -> LaunchRequest:
    """A LaunchRequest for an armed run."""
    return LaunchRequest(
        run_id=armed.run_id,
        attempt_id=armed.attempt_id,
        callback_sequence=1,
        token=armed.token,
        argv=tuple(argv),
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin"},
        log_path=str(log_path),
        log_quota_bytes=quota,
        deadline_at_ms=None,
        leftovers=leftovers,
    )


def events(engine: Engine, run_id: str) -> list[RunEvent]:
    """Every event of a run in order."""
    return RunReader(engine).list_events(run_id, limit=1000).items


def terminal_events(engine: Engine, run_id: str) -> list[str]:
    """Types of the terminal events of a run (a correct history has exactly two)."""
    return [e.type for e in events(engine, run_id) if e.type in TERMINAL_EVENTS]


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``predicate`` until true; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def concurrently(n: int, fn: Callable[[], T], *, timeout: float = 20.0) -> list[T | BaseException]:
    """Call ``fn`` in ``n`` threads released together; what each returned or raised."""
    barrier = threading.Barrier(n)
    results: list[T | BaseException] = []

    def go() -> None:
        barrier.wait()
        try:
            results.append(fn())
        except BaseException as exc:  # handed to the caller's assertions
            results.append(exc)

    threads = [threading.Thread(target=go) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return results


class CrashAfterCommit:
    """A receipt store whose cleanup 'crashes': the named crash point after the completion
    transaction (ending and journal mark) committed, before the file was removed."""

    def __init__(self, real: ReceiptStore) -> None:
        self.real = real

    def read(self, attempt_id: str) -> bytes | None:
        return self.real.read(attempt_id)

    def quarantine(self, attempt_id: str) -> bool:
        return self.real.quarantine(attempt_id)

    def remove(self, attempt_id: str) -> None:
        raise RuntimeError("injected crash between commit and cleanup")


class Worker:
    """One ``qinglong worker`` subprocess (its own data dir, database and socket)."""

    def __init__(self, data_dir: Path, db_url: str, socket_path: Path) -> None:
        self.data_dir = data_dir
        self.socket_path = socket_path
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("QL_")} | {
            "QL_DATA_DIR": str(data_dir),
            "QL_DATABASE_URL": db_url,
            "QL_WORKER_SOCKET": str(socket_path),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = WorkerClient(socket_path, read_timeout_s=DEADLINE)

    def start(self, *, t2: bool = True, nofile: tuple[int, int] | None = None) -> None:
        """Start it; ``t2=False``: a worker that journals a spawn but leaves T2 to the caller
        (``worker_without_t2.py``), so a test can hold the window before T2 open.
        ``nofile``: the (soft, hard) open-file limit it starts with."""
        log = open(self.data_dir / "worker.stderr", "ab")  # noqa: SIM115 (closed by Popen owner)
        module = "app" if t2 else "tests.worker.worker_without_t2"
        argv = [sys.executable, "-m", module, "worker"]
        if nofile is not None:  # set in the exec'd interpreter: the same pid serves
            argv = [sys.executable, "-c", (
                "import os, resource, sys; "
                f"resource.setrlimit(resource.RLIMIT_NOFILE, {nofile!r}); "
                "os.execv(sys.executable, sys.argv[1:])"
            ), *argv]  # fmt: skip
        with log:
            self.proc = subprocess.Popen(
                argv, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        deadline = time.monotonic() + DEADLINE
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited early: {self.stderr()}")
            try:
                if self.client.ping()["pid"] == self.proc.pid:
                    return
            except WorkerUnavailable:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("worker did not answer a ping")
            time.sleep(0.02)

    def stderr(self) -> str:
        return (self.data_dir / "worker.stderr").read_text(errors="replace")

    def signal(self, sig: int) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        code = self.proc.wait(DEADLINE)
        self.proc = None
        return code

    def close(self) -> None:
        self.client.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(DEADLINE)
        self.proc = None


def stop_outside_a_write(proc: subprocess.Popen[Any], engine: Engine) -> None:
    """SIGSTOP ``proc`` at a moment it holds no SQLite write transaction nor checkpoint.

    A process frozen inside one (a lease renewal, a retention pass) keeps the database's one
    writer lock, and every other process waits on it: that is SQLite, not the lease. The
    test's premise is a frozen holder that merely stops renewing.
    """
    if engine.dialect.name != "sqlite":
        proc.send_signal(signal.SIGSTOP)  # PostgreSQL locks rows, not the whole database
        return
    path = engine.url.database
    assert path
    for _ in range(200):
        proc.send_signal(signal.SIGSTOP)
        # SIGSTOP is asynchronous: a thread still running could take the lock after the probe.
        wait_all_threads_stopped(proc.pid)
        probe = sqlite3.connect(path, timeout=0.05, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            # Nor inside a checkpoint: its WAL locks can stall another connection's reads.
            if probe.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[0] == 0:
                return
        except sqlite3.OperationalError:
            pass
        finally:
            probe.close()
        proc.send_signal(signal.SIGCONT)  # caught mid-write: let it finish, try again
        time.sleep(0.02)
    pytest.fail("the worker never left its write transactions")
