"""Issue 11 §1 at the coordinator and the dispatcher: a launch that provably spawned nothing
requeues the run, a refused (fenced) launch records nothing, a pass stops at the first
unavailability. Real databases; the worker is a fake launcher raising what the client raises.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.context.execution_wiring import _drain_concurrently
from app.domain.errors import LaunchOutcomeUnknown, LaunchRejected, LaunchUnavailable
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from tests.execution.kit import FakeLauncher, FlakyTransitions, define, enqueue, make_kit

TERMINAL_RUN = {f"run.{s}" for s in ("succeeded", "failed", "cancelled", "timed_out", "lost")}


def _types(kit: object, run_id: str) -> list[str]:
    return [e.type for e in kit.events(run_id)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("reason", ["WORKER_UNAVAILABLE", "WORKER_SHUTTING_DOWN"])
def test_an_unavailable_worker_requeues_the_run_with_a_fresh_attempt(
    engine: Engine, tmp_path: Path, reason: str
) -> None:
    define(engine)
    run = enqueue(engine)
    launcher = FakeLauncher(engine, error=LaunchUnavailable(reason))
    kit = make_kit(engine, tmp_path / "logs", launcher=launcher)
    result = kit.dispatcher.run_pass()

    assert result.worker_unavailable
    outcome = result.activated
    assert outcome is not None
    assert (outcome.kind, outcome.error_code, outcome.reason) == (
        "requeued", "EXECUTOR_UNAVAILABLE", reason,
    )  # fmt: skip
    after = kit.run(run.id)
    assert after.status == "queued" and after.latest_attempt is not None
    assert (after.latest_attempt.number, after.latest_attempt.status) == (2, "claimed")
    first = RunReader(engine).get_attempt(run.id, 1)
    assert (first.status, first.error_code) == ("failed", "EXECUTOR_UNAVAILABLE")
    assert kit.controller.calls == []  # nothing spawned: nothing to stop

    # The worker is back: the fresh attempt starts, and the run ends once.
    launcher.error = None
    started = kit.dispatcher.run_pass()
    assert started.activated is not None and started.activated.kind == "started"
    now = kit.run(run.id)
    assert (now.status, now.latest_attempt.number) == ("running", 2)  # type: ignore[union-attr]
    assert [t for t in _types(kit, run.id) if t in TERMINAL_RUN] == []
    assert _types(kit, run.id) == [
        "run.queued", "run.dispatching", "attempt.starting",
        "attempt.failed", "run.queued", "attempt.claimed",
        "run.dispatching", "attempt.starting", "attempt.running", "run.running",
    ]  # fmt: skip


def test_a_real_spawn_failure_still_fails_executor_start_failed(
    engine: Engine, tmp_path: Path
) -> None:
    define(engine)
    run = enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs", launcher=FakeLauncher(engine, fail="EXEC_FAILED"))
    result = kit.dispatcher.run_pass()
    assert not result.worker_unavailable  # the worker answered: no back-off
    after = kit.run(run.id)
    assert after.status == "failed" and after.latest_attempt is not None
    assert (after.latest_attempt.number, after.latest_attempt.error_code) == (
        1, "EXECUTOR_START_FAILED",
    )  # fmt: skip


@pytest.mark.parametrize("reason", ["ATTEMPT_FENCED", "ATTEMPT_NOT_STARTING"])
def test_a_fenced_launch_records_no_second_ending(
    engine: Engine, tmp_path: Path, reason: str
) -> None:
    # Recovery fenced the attempt and requeued the run while this launch was on its way:
    # the worker refuses it, and the coordinator must not write anything for it.
    define(engine)
    run = enqueue(engine)
    repo = RunRepository(engine)

    def requeued_meanwhile(request: object) -> object:
        repo.requeue_unspawned(run_id=run.id, attempt_id=run.latest_attempt.id)  # type: ignore[union-attr]
        raise LaunchRejected(reason)

    kit = make_kit(engine, tmp_path / "logs", launcher=FakeLauncher(engine, handle=requeued_meanwhile))  # type: ignore[arg-type]
    result = kit.dispatcher.run_pass()
    outcome = result.activated
    assert outcome is not None and (outcome.kind, outcome.reason) == ("unresolved", reason)
    assert not result.worker_unavailable
    after = kit.run(run.id)
    assert (after.status, after.latest_attempt.number) == ("queued", 2)  # type: ignore[union-attr]
    types = _types(kit, run.id)
    assert types.count("attempt.failed") == 1 and not set(types) & TERMINAL_RUN


@pytest.mark.parametrize(
    "error", [LaunchOutcomeUnknown("WORKER_NO_ANSWER"), RuntimeError("a launcher bug")]
)
def test_a_launch_with_no_answer_records_no_ending_and_backs_off(
    engine: Engine, tmp_path: Path, error: Exception
) -> None:
    # The request may have reached the worker: a process may exist, so the start stays as
    # T1 left it for recovery (fail closed); an error the port does not declare is the same.
    define(engine)
    run = enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs", launcher=FakeLauncher(engine, error=error))
    result = kit.dispatcher.run_pass()
    outcome = result.activated
    assert outcome is not None
    assert (outcome.kind, outcome.reason, outcome.error_code) == (
        "unresolved", "LAUNCH_OUTCOME_UNKNOWN", None,
    )  # fmt: skip
    assert result.worker_unavailable  # no answer: back off as for an absent worker
    after = kit.run(run.id)
    assert after.latest_attempt is not None
    assert (after.status, after.latest_attempt.status) == ("dispatching", "starting")
    assert _types(kit, run.id)[-2:] == ["run.dispatching", "attempt.starting"]
    assert kit.controller.calls == []  # never stopped on a guess


def test_a_failed_requeue_leaves_the_start_for_recovery(engine: Engine, tmp_path: Path) -> None:
    define(engine)
    run = enqueue(engine)
    kit = make_kit(
        engine, tmp_path / "logs",
        launcher=FakeLauncher(engine, error=LaunchUnavailable("WORKER_UNAVAILABLE")),
        transitions=FlakyTransitions(engine, fail_requeue=True),
    )  # fmt: skip
    result = kit.dispatcher.run_pass()
    assert result.worker_unavailable
    assert result.activated is not None and result.activated.kind == "unresolved"
    after = kit.run(run.id)
    assert (after.status, after.latest_attempt.status) == ("dispatching", "starting")  # type: ignore[union-attr]


def test_a_cancel_intent_ends_a_start_that_found_no_worker(engine: Engine, tmp_path: Path) -> None:
    define(engine)
    run = enqueue(engine)
    repo = RunRepository(engine)

    def cancelled_meanwhile(request: object) -> object:
        repo.request_cancel(run_id=run.id, reason="user")
        raise LaunchUnavailable("WORKER_UNAVAILABLE")

    kit = make_kit(engine, tmp_path / "logs", launcher=FakeLauncher(engine, handle=cancelled_meanwhile))  # type: ignore[arg-type]
    result = kit.dispatcher.run_pass()
    assert result.activated is not None and result.activated.kind == "ended"
    assert kit.run(run.id).status == "cancelled"
    assert [t for t in _types(kit, run.id) if t in TERMINAL_RUN] == ["run.cancelled"]


@pytest.mark.parametrize("drainers", [1, 4])
def test_a_drain_stops_at_the_first_unavailability(
    engine: Engine, tmp_path: Path, drainers: int
) -> None:
    # docs/design.md §3.3: no silent retry storm. With the worker gone, a drain makes one launch
    # per drain thread at most, requeues only those, and leaves the rest of the queue alone.
    define(engine)
    runs = [enqueue(engine) for _ in range(12)]
    launcher = FakeLauncher(engine, error=LaunchUnavailable("WORKER_UNAVAILABLE"))
    kit = make_kit(engine, tmp_path / "logs", launcher=launcher)
    assert _drain_concurrently(kit.dispatcher, drainers) is True
    assert launcher.calls == 1  # the first pass found it: no helper thread was started
    numbers = sorted(kit.run(r.id).latest_attempt.number for r in runs)  # type: ignore[union-attr]
    assert numbers == [1] * 11 + [2]
    assert {kit.run(r.id).status for r in runs} == {"queued"}
