"""``qinglong worker`` as a real subprocess: socket, launch, live completion, crash, restart.

Each test starts ``python -m app worker`` with its own data dir, database and a short socket
path, waits for a ping, and ends it by pid. Jobs are gated on files the test creates, so
nothing depends on timing; every wait is a bounded poll of a real condition.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.domain.model import ProcessHandle, Run
from app.storage.journal_repo import CONSUMED, JournalRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.worker.identity import current_boot_id, read_identity, wait_exit
from app.worker.receipts import ReceiptStore
from tests.worker.kit import (
    DEADLINE,
    ROOT,
    TERMINAL,
    Armed,
    Processes,
    Worker,
    armed_run,
    launch_request,
    make_log,
    terminal_events,
    wait_for,
)


class Setup:
    def __init__(self, engine: Engine, db_url: str, data_dir: Path, sock: Path) -> None:
        self.engine = engine
        self.data_dir = data_dir
        self.worker = Worker(data_dir, db_url, sock)
        self.runs = RunRepository(engine)
        self.reader = RunReader(engine)
        self.journal = JournalRepository(engine)
        self.store = ReceiptStore(data_dir / "receipts")

    def launch(self, armed: Armed, script: str, procs: Processes) -> ProcessHandle:
        log = make_log(self.data_dir / "logs", armed.attempt_id)
        request = launch_request(
            armed, argv=["/bin/sh", "-c", script], log_path=log, cwd=str(self.data_dir)
        )
        launched = self.worker.client.launch_recording(request)
        handle = procs.track(launched.handle)
        assert launched.running  # the worker committed T2 with its spawn record
        return handle

    def run(self, armed: Armed) -> Run:
        return self.reader.get_run(armed.run_id)

    def wait_terminal(self, armed: Armed) -> Run:
        wait_for(lambda: self.run(armed).status in TERMINAL, "the run to end")
        wait_for(lambda: self._consumed(armed), "the journal to record consumption")
        return self.run(armed)

    def _consumed(self, armed: Armed) -> bool:
        entry = self.journal.get(armed.attempt_id)
        return entry is not None and entry.state == CONSUMED


@pytest.fixture
def setup(
    engine: Engine, db_url: str, tmp_path: Path, short_dir: Path, procs: Processes
) -> Iterator[Setup]:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    s = Setup(engine, db_url, data_dir, short_dir / "w.sock")
    s.worker.start()
    try:
        yield s
    finally:
        s.worker.close()


def gated(gate: str, then: str) -> str:
    return f"echo before; while [ ! -e {gate} ]; do sleep 0.01; done; echo after; {then}"


@pytest.mark.parametrize(
    ("then", "status", "exit_code", "sig"),
    [("exit 3", "failed", 3, None), ("exit 0", "succeeded", 0, None),
     ("kill -KILL $$", "failed", None, 9)],
)
def test_live_completion_records_the_exact_ending_once(
    setup: Setup, procs: Processes, then: str, status: str, exit_code: int | None,
    sig: int | None,
) -> None:
    # The worker made every receipt shard when it started (no launch syncs the root).
    shards = [p for p in setup.store.root.iterdir() if p.name != ".quarantine"]
    assert len(shards) == 256 and all(p.is_dir() for p in shards)
    armed = armed_run(setup.engine)
    handle = setup.launch(armed, gated("gate", then), procs)
    assert setup.run(armed).status == "running"
    (setup.data_dir / "gate").touch()
    run = setup.wait_terminal(armed)
    attempt = run.latest_attempt
    assert attempt is not None
    assert (run.status, attempt.exit_code, attempt.signal) == (status, exit_code, sig)
    assert attempt.log is not None and attempt.log.bytes == len(b"before\nafter\n")
    assert terminal_events(setup.engine, armed.run_id) == [f"attempt.{status}", f"run.{status}"]
    assert not setup.store.path_of(armed.attempt_id).exists()
    assert wait_exit(handle.shim_pid, DEADLINE)


def test_stop_by_identity_through_the_socket(setup: Setup, procs: Processes) -> None:
    armed = armed_run(setup.engine)
    handle = setup.launch(armed, gated("never", "exit 0"), procs)
    assert setup.worker.client.stop(handle, grace_seconds=5.0) == "stopped"
    assert read_identity(handle.pid) is None
    run = setup.wait_terminal(armed)  # no cancel intent: a plain signal ending
    assert run.latest_attempt is not None
    assert (run.status, run.latest_attempt.signal) == ("failed", signal.SIGTERM)
    assert setup.worker.client.stop(handle, grace_seconds=1.0) == "already_exited"


def test_second_launch_through_the_socket_returns_the_first_handle(
    setup: Setup, procs: Processes
) -> None:
    armed = armed_run(setup.engine)
    log = make_log(setup.data_dir / "logs", armed.attempt_id)
    script = "echo x >> spawns; while [ ! -e gate ]; do sleep 0.01; done"
    request = launch_request(
        armed, argv=["/bin/sh", "-c", script], log_path=log, cwd=str(setup.data_dir)
    )
    first = procs.track(setup.worker.client.launch(request))
    assert setup.worker.client.launch(request) == first
    wait_for(lambda: (setup.data_dir / "spawns").exists(), "the job to start")
    (setup.data_dir / "gate").touch()
    assert wait_exit(first.shim_pid, DEADLINE)
    assert (setup.data_dir / "spawns").read_text() == "x\n"


def test_sigterm_stops_the_worker_but_not_the_jobs(setup: Setup, procs: Processes) -> None:
    armed = armed_run(setup.engine)
    handle = setup.launch(armed, gated("gate", "exit 4"), procs)
    assert setup.worker.signal(signal.SIGTERM) == 0
    assert not setup.worker.socket_path.exists()
    assert read_identity(handle.pid) is not None and read_identity(handle.shim_pid) is not None
    # The next worker re-arms the watch on the still-running shim from the journal.
    setup.worker.start()
    assert setup.run(armed).status == "running"
    (setup.data_dir / "gate").touch()
    run = setup.wait_terminal(armed)
    assert run.latest_attempt is not None
    assert (run.status, run.latest_attempt.exit_code) == ("failed", 4)
    assert terminal_events(setup.engine, armed.run_id) == ["attempt.failed", "run.failed"]


def test_worker_killed_mid_job_then_restarted_records_the_ending_once(
    setup: Setup, procs: Processes
) -> None:
    armed = armed_run(setup.engine)
    handle = setup.launch(armed, gated("gate", "exit 5"), procs)
    assert setup.worker.signal(signal.SIGKILL) == -signal.SIGKILL
    assert read_identity(handle.pid) is not None  # the job survived its worker
    (setup.data_dir / "gate").touch()
    assert wait_exit(handle.shim_pid, DEADLINE)
    assert setup.store.path_of(armed.attempt_id).exists()  # the receipt waits
    log = setup.data_dir / "logs"
    assert b"after" in next(log.rglob(f"{armed.attempt_id}.log")).read_bytes()
    assert setup.run(armed).status == "running"
    setup.worker.start()  # stale socket replaced; the journal re-arms live completion
    run = setup.wait_terminal(armed)
    assert run.latest_attempt is not None
    assert (run.status, run.latest_attempt.exit_code) == ("failed", 5)
    assert terminal_events(setup.engine, armed.run_id) == ["attempt.failed", "run.failed"]
    assert not setup.store.path_of(armed.attempt_id).exists()


def test_worker_refuses_an_unmigrated_database(tmp_path: Path, short_dir: Path) -> None:
    data_dir = tmp_path / "fresh"
    worker = Worker(data_dir, f"sqlite:///{tmp_path / 'empty.db'}", short_dir / "w.sock")
    done = subprocess.run(
        [sys.executable, "-m", "app", "worker"], cwd=ROOT, env=worker.env,
        capture_output=True, timeout=DEADLINE, check=False,
    )
    assert done.returncode == 1
    assert b"qinglong migrate" in done.stderr
    assert not (short_dir / "w.sock").exists()


def test_a_starting_worker_removes_the_reservations_of_spares_that_died(
    setup: Setup, procs: Processes
) -> None:
    """A spare killed while it waited leaves its receipt reservation made ahead in the
    receipts root (api-schemas/launch-protocol.md §8); the next worker start removes it,
    and launches go on (the zygote's new spares make their own)."""
    assert setup.worker.signal(signal.SIGTERM) == 0
    dead = subprocess.Popen(["/bin/true"])
    dead.wait()  # reaped: its pid names no process now (and its start ticks never match)
    claim = {"boot_id": current_boot_id(), "shim_pid": dead.pid, "shim_start_ticks": 1}
    stale = setup.store.root / f".spare-{dead.pid}-1.tmp"
    stale.write_bytes(json.dumps(claim, separators=(",", ":")).encode().ljust(4096, b"\0"))
    setup.worker.start()
    assert not stale.exists()
    armed = armed_run(setup.engine)
    handle = setup.launch(armed, "exit 0", procs)
    assert setup.wait_terminal(armed).status == "succeeded"
    assert wait_exit(handle.shim_pid, DEADLINE)
