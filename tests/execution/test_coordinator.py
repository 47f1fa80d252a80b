"""The two-transaction start protocol (docs/design.md §3.7, §3.8) on real databases."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.domain.artifacts import log_artifact_id, receipt_relpath
from app.domain.canonical import sha256_digest
from app.domain.errors import DomainError
from app.domain.execution import Launched, LaunchRequest
from app.domain.ids import now_ms
from app.domain.model import ProcessHandle, Run
from app.execution.dispatcher import CandidateOutcome
from app.storage.journal_repo import JournalRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from tests.execution.kit import (
    FakeController,
    FakeLauncher,
    FlakyTransitions,
    Kit,
    all_database_text,
    define,
    enqueue,
    fake_handle,
    make_kit,
)


def test_launcher_observes_dispatching_and_starting_already_committed(
    engine: Engine, tmp_path: Path
) -> None:
    """Digest, deadline, log artifact and the first two events are committed first."""
    define(engine, timeout_seconds=30)
    run = enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs")
    kit.dispatcher.run_pass()

    assert kit.launcher.calls == 1
    seen = kit.launcher.observed[0]
    attempt = seen.run.latest_attempt
    assert attempt is not None
    assert (seen.run.status, attempt.status) == ("dispatching", "starting")
    assert seen.digest == sha256_digest(seen.request.token.encode("utf-8"))
    assert attempt.deadline_at_ms is not None
    assert attempt.deadline_at_ms == seen.request.deadline_at_ms
    assert attempt.log_artifact_id == log_artifact_id(attempt.id)
    assert [(e.seq, e.type) for e in seen.events] == [
        (1, "run.queued"),
        (2, "run.dispatching"),
        (3, "attempt.starting"),
    ]
    assert seen.log_exists
    assert seen.request.run_id == run.id
    assert seen.request.callback_sequence == 1


def test_successful_start_is_running_with_four_contiguous_steps_and_no_token_in_results(
    engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Running/running, version and event seq advance by exactly four, no plaintext."""
    caplog.set_level(logging.DEBUG)
    define(engine)
    run = enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs")
    result = kit.dispatcher.run_pass()

    after = kit.run(run.id)
    assert after.latest_attempt is not None
    assert (after.status, after.latest_attempt.status) == ("running", "running")
    assert after.version == run.version + 4
    events = kit.events(run.id)
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert [e.type for e in events[1:]] == [
        "run.dispatching",
        "attempt.starting",
        "attempt.running",
        "run.running",
    ]
    assert result.activated is not None and result.activated.kind == "started"
    token = kit.launcher.observed[0].request.token
    assert len(token) >= 43  # 256 bits, base64url
    for text in (repr(result), repr(kit.launcher.observed[0].request), caplog.text):
        assert token not in text
    assert token not in all_database_text(engine)
    assert token not in repr(events)


def test_launch_failure_fails_both_without_calling_the_controller(
    engine: Engine, tmp_path: Path
) -> None:
    """LaunchFailed before a handle → both failed, EXECUTOR_START_FAILED, no stop."""
    define(engine)
    run = enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs", launcher=FakeLauncher(engine, fail="EXEC_FAILED"))
    result = kit.dispatcher.run_pass()

    after = kit.run(run.id)
    assert after.latest_attempt is not None
    assert (after.status, after.latest_attempt.status) == ("failed", "failed")
    assert after.latest_attempt.error_code == "EXECUTOR_START_FAILED"
    assert kit.controller.calls == []
    failure = result.launch_failure
    assert failure is not None
    assert (failure.kind, failure.error_code, failure.reason) == (
        "start_failed",
        "EXECUTOR_START_FAILED",
        "EXEC_FAILED",
    )


@pytest.mark.parametrize("stop_result", ["stopped", "already_exited"])
def test_post_spawn_persist_failure_stops_exact_identity_before_marking_lost(
    engine: Engine, tmp_path: Path, stop_result: str
) -> None:
    """T2 fails → the exact handle is stopped first, then both are lost."""
    define(engine)
    run = enqueue(engine)
    handle = fake_handle(5151)
    at_stop: list[tuple[str, str]] = []

    def look(_: ProcessHandle) -> None:
        now = RunReader(engine).get_run(run.id)
        assert now.latest_attempt is not None
        at_stop.append((now.status, now.latest_attempt.status))

    kit = make_kit(
        engine,
        tmp_path / "logs",
        launcher=FakeLauncher(engine, handle=handle),
        controller=FakeController(stop_result, on_stop=look),  # type: ignore[arg-type]
        transitions=FlakyTransitions(engine, fail_t2=True),
    )
    result = kit.dispatcher.run_pass()

    assert kit.controller.calls == [handle]
    assert at_stop == [("dispatching", "starting")]
    after = kit.run(run.id)
    assert after.latest_attempt is not None
    assert (after.status, after.latest_attempt.status) == ("lost", "lost")
    assert after.latest_attempt.error_code == "POST_SPAWN_PERSIST_FAILED"
    assert result.launch_failure is not None and result.launch_failure.kind == "lost"


@pytest.mark.parametrize("stop_result", ["unknown", "raises", "compensation_write_fails"])
def test_unknown_stop_leaves_dispatching_starting_for_recovery(
    engine: Engine, tmp_path: Path, stop_result: str
) -> None:
    """Without a proven stop the aggregate stays dispatching/starting and findable."""
    define(engine)
    run = enqueue(engine)
    controller = FakeController(
        OSError("controller unavailable") if stop_result == "raises"
        else "unknown" if stop_result == "unknown" else "stopped"
    )
    transitions = FlakyTransitions(engine, fail_t2=True)
    transitions.fail_fail = stop_result == "compensation_write_fails"
    kit = make_kit(engine, tmp_path / "logs", controller=controller, transitions=transitions)
    result = kit.dispatcher.run_pass()

    assert len(controller.calls) == 1
    after = kit.run(run.id)
    assert after.latest_attempt is not None
    assert (after.status, after.latest_attempt.status) == ("dispatching", "starting")
    assert result.launch_failure is not None and result.launch_failure.kind == "unresolved"
    active = RunReader(engine).active_attempts(limit=10)
    assert [a.attempt_id for a in active] == [after.latest_attempt.id]
    # A later pass does not touch it: it is no longer a dispatch candidate.
    assert kit.dispatcher.run_pass().outcomes == ()
    assert kit.launcher.calls == 1


def test_implausible_handle_is_never_given_to_the_controller(
    engine: Engine, tmp_path: Path
) -> None:
    """A handle that names no process gets no stop, no ending."""
    define(engine)
    run = enqueue(engine)
    bad = ProcessHandle(boot_id="", pid=0, pgid=0, start_ticks=0, shim_pid=0, shim_start_ticks=0)
    kit = make_kit(engine, tmp_path / "logs", launcher=FakeLauncher(engine, handle=bad))
    result = kit.dispatcher.run_pass()

    assert kit.controller.calls == []
    after = kit.run(run.id)
    assert after.latest_attempt is not None
    assert (after.status, after.latest_attempt.status) == ("dispatching", "starting")
    assert result.activated is not None and result.activated.reason == "INVALID_HANDLE"


def test_second_start_of_same_attempt_is_rejected(engine: Engine, tmp_path: Path) -> None:
    """The durable aggregate, not memory, refuses a replayed start."""
    define(engine)
    run = enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs")
    materializer = kit.materializer()
    command = materializer.materialize(kit.candidate(run.id))
    coordinator = kit.coordinator()
    assert coordinator.start(command).status == "running"

    with pytest.raises(RuntimeError):
        coordinator.start(command)  # one-shot object
    with pytest.raises(DomainError):
        kit.coordinator().start(command)  # a fresh coordinator: T1 CAS refuses
    assert kit.launcher.calls == 1
    assert kit.dispatcher.run_pass().outcomes == ()
    assert kit.launcher.calls == 1
    after = kit.run(run.id)
    assert after.version == run.version + 4


class WorkerT2Launcher(FakeLauncher):
    """Journals and commits T2 on the real database, as the worker's launcher does, and
    answers ``running`` (``running=False``: the journal entry alone, T2 left to the caller)."""

    def __init__(self, engine: Engine, *, running: bool = True, repeat: bool = False) -> None:
        super().__init__(engine)
        self._journal = JournalRepository(engine)
        self._runs = RunRepository(engine)
        self._running = running
        self._repeat = repeat  # answer as a repeated request is: from the journal, no flag

    def launch_recording(self, request: LaunchRequest) -> Launched:
        handle = self.launch(request)
        self._journal.reserve(
            attempt_id=request.attempt_id, run_id=request.run_id,
            receipt_ref=receipt_relpath(request.attempt_id), only_if_starting=True,
        )  # fmt: skip
        started = now_ms()
        if not self._running:
            assert self._journal.record_spawned(attempt_id=request.attempt_id, handle=handle)
            return Launched(handle, started)
        written = self._runs.record_spawned_running(
            run_id=request.run_id, attempt_id=request.attempt_id, handle=handle,
            started_at_ms=started,
        )  # fmt: skip
        if self._repeat:
            return Launched(handle, None)
        return Launched(handle, started, running=written == "running")


def _one_start_through(
    engine: Engine, tmp_path: Path, launcher: WorkerT2Launcher
) -> tuple[Kit, FlakyTransitions, Run, CandidateOutcome]:
    """One pass through ``launcher``; the run must end the pass ``running`` with one T2 and
    the usual four steps. The kit, its transitions, the run after, the started outcome."""
    define(engine)
    run = enqueue(engine)
    transitions = FlakyTransitions(engine)
    kit = make_kit(engine, tmp_path / "logs", launcher=launcher, transitions=transitions)
    result = kit.dispatcher.run_pass()
    after = kit.run(run.id)
    assert after.latest_attempt is not None
    assert (after.status, after.latest_attempt.status) == ("running", "running")
    assert after.version == run.version + 4
    assert [e.type for e in kit.events(run.id)[1:]] == [
        "run.dispatching", "attempt.starting", "attempt.running", "run.running",
    ]  # fmt: skip
    started = result.activated
    assert started is not None and started.kind == "started"
    return kit, transitions, after, started


@pytest.mark.parametrize("worker_t2", [True, False])
def test_a_start_whose_worker_committed_t2_writes_nothing_more(
    engine: Engine, tmp_path: Path, worker_t2: bool
) -> None:
    launcher = WorkerT2Launcher(engine, running=worker_t2)
    _, transitions, after, started = _one_start_through(engine, tmp_path, launcher)
    assert transitions.t2_calls == (0 if worker_t2 else 1)  # one T2 either way, never two
    # created→started is measured either way (the metric): from the run read back by T2, or
    # from T1's run and the shim's start time when the worker wrote T2.
    assert after.started_at_ms is not None
    assert started.created_to_started_ms == after.started_at_ms - after.created_at_ms


def test_a_repeated_launch_answered_without_running_leaves_the_job_alone(
    engine: Engine, tmp_path: Path
) -> None:
    # The worker committed T2 for the first request; the repeat (the connection broke after
    # it was sent) is answered from the journal without "running". The api's own T2 is then
    # refused, and the job must not be stopped as a failed T2.
    launcher = WorkerT2Launcher(engine, repeat=True)
    kit, transitions, _, _ = _one_start_through(engine, tmp_path, launcher)
    assert transitions.t2_calls == 1  # tried, and refused
    assert kit.controller.calls == []  # nothing stopped
