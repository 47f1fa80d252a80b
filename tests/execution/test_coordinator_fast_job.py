"""A job that ends before T2: the coordinator reports the committed ending, not "unresolved".

The launcher fake applies the job's completion (the worker's live path) from ``starting``
inside ``launch``, so T2 loses deterministically. The completion already recorded the whole
history (running, then the ending), so nothing is stopped and nothing is reported as failed.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine

from app.domain.execution import LaunchRequest
from app.domain.ids import now_ms
from app.domain.model import ProcessHandle
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from tests.execution.kit import FakeController, FakeLauncher, define, enqueue, fake_handle, make_kit
from tests.worker.kit import terminal_events


def test_a_job_that_ended_before_t2_is_reported_ended(engine: Engine, tmp_path: Path) -> None:
    define(engine)
    run = enqueue(engine)
    repo = RunRepository(engine)

    def finish_then_hand_back(request: LaunchRequest) -> ProcessHandle:
        outcome = repo.complete_attempt(
            run_id=request.run_id,
            attempt_id=request.attempt_id,
            token=request.token,
            callback_sequence=1,
            exit_code=0,
            signal=None,
            finished_at_ms=now_ms(),
            started_at_ms=now_ms() - 5,
        )
        assert (outcome.status, outcome.run_status) == ("applied", "succeeded")
        return fake_handle()

    controller = FakeController("already_exited")
    kit = make_kit(
        engine,
        tmp_path / "logs",
        launcher=FakeLauncher(engine, handle=finish_then_hand_back),
        controller=controller,
    )
    report = kit.dispatcher.run_pass()
    outcome = next(o for o in report.outcomes if o.run_id == run.id)
    assert outcome.kind == "ended" and outcome.error_code is None
    assert report.launch_failure is None
    assert controller.calls == []  # a run the completion ended has no process to stop
    assert terminal_events(engine, run.id) == ["attempt.succeeded", "run.succeeded"]
    types = [e.type for e in RunReader(engine).list_events(run.id).items]
    assert types == [
        "run.queued", "run.dispatching", "attempt.starting", "attempt.running",
        "run.running", "attempt.succeeded", "run.succeeded",
    ]  # fmt: skip
    ended = RunReader(engine).get_run(run.id)
    assert ended.started_at_ms is not None and ended.latest_attempt is not None
    assert ended.latest_attempt.started_at_ms == ended.started_at_ms
