"""The crash-survival rig: a real ``qinglong worker`` subprocess, real jobs, bounded polls."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import Engine

from app.domain.artifacts import log_artifact_id
from app.domain.canonical import sha256_digest
from app.domain.errors import ErrorCode, WorkerUnavailable
from app.domain.execution import Launched
from app.domain.ids import now_ms
from app.domain.model import ProcessHandle, Run
from app.domain.profiles import EDGE
from app.domain.tokens import new_callback_token
from app.execution.completion import CompletionService
from app.execution.reconciler import DEFAULT_START_GRACE_S, Reconciler
from app.storage.definitions_repo import DefinitionRepository
from app.storage.journal_repo import JournalRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.worker.identity import wait_exit
from app.worker.launcher import IdentityController
from app.worker.log_facts import LogFacts
from app.worker.probe import HandleProbe
from app.worker.receipts import ReceiptStore
from tests.worker.kit import (
    DEADLINE,
    ROOT,
    TERMINAL,
    Armed,
    Processes,
    Worker,
    launch_request,
    make_log,
    terminal_events,
    wait_for,
)

__all__ = [
    "DEADLINE", "TERMINAL", "Armed", "HaltingWorker", "Rig", "in_process_reconciler",
    "terminal_events", "wait_for",
]


class Rig:
    """One worker (start, kill -9, restart) plus the repositories a test inspects."""

    def __init__(
        self, engine: Engine, db_url: str, data_dir: Path, sock: Path, procs: Processes
    ) -> None:
        self.engine = engine
        self.data_dir = data_dir
        self.procs = procs
        self.worker = Worker(data_dir, db_url, sock)
        self.runs = RunRepository(engine)
        self.reader = RunReader(engine)
        self.journal = JournalRepository(engine)
        self.store = ReceiptStore(data_dir / "receipts")
        DefinitionRepository(engine).put_revision(
            task="job", revision=1, executor="local_process", argv=["true"], cwd=None,
            recipe=None, timeout_seconds=None, priority=0,
        )

    def arm(self, *, deadline_at_ms: int | None = None, task: str = "job") -> Armed:
        """Enqueue a run and commit T1 (dispatching/starting) with a deadline."""
        run, _ = self.runs.enqueue_run(task=task, revision=1, priority=None)
        assert run.latest_attempt is not None
        token = new_callback_token()
        self.runs.begin_dispatch(
            run_id=run.id, attempt_id=run.latest_attempt.id, expected_version=None,
            token_digest=sha256_digest(token.encode("utf-8")), deadline_at_ms=deadline_at_ms,
            log_artifact_id=log_artifact_id(run.latest_attempt.id),
        )
        return Armed(run.id, run.latest_attempt.id, token)

    def spawn(self, armed: Armed, script: str) -> ProcessHandle:
        """Launch through the worker socket (journal, shim) without T2: the worker must have
        been started with ``t2=False``."""
        launched = self._launch(armed, script)
        assert not launched.running, "start the worker with t2=False to hold T2 back"
        return launched.handle

    def launch(self, armed: Armed, script: str) -> ProcessHandle:
        """Launch with T2 committed: by the worker, or (``t2=False``) here, as the api would."""
        launched = self._launch(armed, script)
        if not launched.running:
            self.runs.record_running(
                run_id=armed.run_id, attempt_id=armed.attempt_id, handle=launched.handle,
                started_at_ms=now_ms(),
            )  # fmt: skip
        return launched.handle

    def _launch(self, armed: Armed, script: str) -> Launched:
        log = make_log(self.data_dir / "logs", armed.attempt_id)
        request = launch_request(
            armed, argv=["/bin/sh", "-c", script], log_path=log, cwd=str(self.data_dir)
        )
        launched = self.worker.client.launch_recording(request)
        self.procs.track(launched.handle)
        return launched

    def ended_while_down(self, then: str) -> Armed:
        """Start the worker, launch a gated job, SIGKILL the worker, let the job end.

        The named crash point 'receipt published, worker gone': on return the shim has
        exited and its receipt waits for a worker that is not there.
        """
        self.worker.start()
        a = self.arm()
        h = self.launch(a, gated("g", then=then))
        self.kill_worker()
        self.gate("g").touch()
        assert wait_exit(h.shim_pid, DEADLINE)
        return a

    def kill_worker(self) -> None:
        """SIGKILL the worker (its pid) and reap it: the named crash point 'worker gone'."""
        assert self.worker.signal(signal.SIGKILL) == -signal.SIGKILL

    def run(self, armed: Armed) -> Run:
        return self.reader.get_run(armed.run_id)

    def wait_status(self, armed: Armed, *statuses: str) -> Run:
        """Poll (bounded) until the run is in one of ``statuses``."""
        wanted = set(statuses) or TERMINAL
        wait_for(lambda: self.run(armed).status in wanted, f"the run to be {sorted(wanted)}")
        return self.run(armed)

    def log_bytes(self, armed: Armed) -> bytes:
        return next((self.data_dir / "logs").rglob(f"{armed.attempt_id}.log")).read_bytes()

    def gate(self, name: str) -> Path:
        return self.data_dir / name

    def past_start_grace(self, armed: Armed) -> None:
        """Wait (bounded) until the attempt has been starting for longer than the grace."""
        since = self.reader.starting_since_ms(armed.run_id)
        assert since is not None
        wait_for(lambda: now_ms() - since > DEFAULT_START_GRACE_S * 1000, "the start grace")

    def assert_ended(self, armed: Armed, code: ErrorCode, status: str = "lost") -> None:
        """The run ends ``status`` with ``code``, with exactly one terminal event pair."""
        run = self.wait_status(armed)
        assert run.latest_attempt is not None
        assert (run.status, run.latest_attempt.error_code) == (status, code.value)
        assert terminal_events(self.engine, armed.run_id) == [f"attempt.{status}", f"run.{status}"]

    def assert_requeued(self, armed: Armed) -> Run:
        """The start was fenced, then the run queued again: attempt 1 failed
        EXECUTOR_UNAVAILABLE, attempt 2 claimed, no terminal run event (docs/backlog-requeue.md)."""
        wait_for(lambda: self.run(armed).status == "queued", "the run to be requeued")
        run = self.run(armed)
        assert run.latest_attempt is not None
        assert (run.latest_attempt.number, run.latest_attempt.status) == (2, "claimed")
        first = self.reader.get_attempt(armed.run_id, 1)
        assert (first.status, first.error_code) == ("failed", "EXECUTOR_UNAVAILABLE")
        entry = self.journal.get(armed.attempt_id)
        assert entry is not None and entry.state == "fenced"  # a late launch is refused
        assert self.event_types(armed)[-3:] == ["attempt.failed", "run.queued", "attempt.claimed"]
        assert terminal_events(self.engine, armed.run_id) == ["attempt.failed"]
        return run

    def event_types(self, armed: Armed) -> list[str]:
        return [e.type for e in self.reader.list_events(armed.run_id, limit=1000).items]


class HaltingWorker(Worker):
    """The rig's worker that halts at one named launch point (``crash_worker.py``)."""

    def __init__(self, rig: Rig, point: str) -> None:
        base = rig.worker
        super().__init__(base.data_dir, base.env["QL_DATABASE_URL"], base.socket_path)
        self.mark = base.data_dir / f"halted-{point}"
        self.env |= {"QLTEST_CRASH_AT": point, "QLTEST_CRASH_MARK": str(self.mark)}
        self.rig = rig
        self.launch_error: BaseException | None = None

    def start(self) -> None:
        log = open(self.data_dir / "worker.stderr", "ab")  # noqa: SIM115 (closed by Popen owner)
        with log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.recovery.crash_worker", "worker"], cwd=ROOT,
                env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            )
        self.rig.procs.track_pid(self.proc.pid)
        wait_for(self._answers, "the halting worker to answer a ping")

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"worker exited early: {self.stderr()}")
        try:
            return bool(self.client.ping()["pid"] == self.proc.pid)
        except WorkerUnavailable:
            time.sleep(0.02)
            return False

    def launch_until_halted(self, armed: Armed, script: str) -> None:
        """Send the launch (as the api would), wait for the halt, SIGKILL the worker there."""
        log = make_log(self.data_dir / "logs", armed.attempt_id)
        request = launch_request(
            armed, argv=["/bin/sh", "-c", script], log_path=log, cwd=str(self.data_dir)
        )

        def send() -> None:
            try:
                self.client.launch(request)
            except BaseException as exc:  # the answer never comes: the worker died
                self.launch_error = exc

        sender = threading.Thread(target=send, name="halting-launch")
        sender.start()
        wait_for(self.mark.exists, "the worker to reach its crash point")
        assert self.signal(signal.SIGKILL) == -signal.SIGKILL
        sender.join(DEADLINE)
        assert not sender.is_alive() and self.launch_error is not None
        self.client.close()


def gated(*gates: str, then: str, tag: str = "") -> str:
    """A job that prints, waits for each gate file in turn printing after each, then ``then``."""
    parts = [f"echo start{tag}"]
    for g in gates:
        parts.append(f"while [ ! -e {g} ]; do sleep 0.01; done; echo past-{g}{tag}")
    parts.append(then)
    return "; ".join(parts)


def in_process_reconciler(engine: Engine, store: ReceiptStore, clock: list[int]) -> Reconciler:
    """The worker's reconciler wiring on the edge profile, with an injected clock."""
    journal, runs = JournalRepository(engine), RunRepository(engine)
    completion = CompletionService(
        receipts=store, journal=journal, completions=runs, log_facts=LogFacts(store.root)
    )
    return Reconciler(
        attempts=RunReader(engine), journal=journal, completion=completion, transitions=runs,
        probe=HandleProbe(), controller=IdentityController(), quarantine_files=store,
        reservations=store, profile=EDGE, clock=lambda: clock[0],
    )
