"""Random transition sequences: versions and event seqs stay contiguous, endings are final."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import Engine

from app.domain.errors import DomainError, ErrorCode
from app.domain.states import TERMINAL_RUN
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from tests.storage.helpers import HANDLE, TOKEN, define_task, dispatch


def test_random_transition_sequences_keep_the_history_consistent(engine: Engine) -> None:
    define_task(engine)
    repo, reader = RunRepository(engine), RunReader(engine)

    class RunMachine(RuleBasedStateMachine):
        runs = Bundle("runs")

        def __init__(self) -> None:
            super().__init__()
            self.expected: dict[str, dict[str, Any]] = {}

        def _apply(self, run_id: str, action: Any, steps: int) -> None:
            before = reader.get_run(run_id)
            try:
                after = action(before)
            except DomainError:
                now = reader.get_run(run_id)
                assert (now.status, now.version) == (before.status, before.version)
                return
            model = self.expected[run_id]
            assert model["status"] not in TERMINAL_RUN, "a terminal run changed"
            delta = steps(before, after) if callable(steps) else steps
            model["version"] += delta
            model["status"] = after

        @rule(target=runs)
        def enqueue(self) -> str:
            run, _ = repo.enqueue_run(task="job", revision=None, priority=None)
            self.expected[run.id] = {"version": 1, "status": "queued"}
            return run.id

        @rule(run_id=runs)
        def begin_dispatch(self, run_id: str) -> None:
            self._apply(run_id, lambda run: dispatch(engine, run).status, 2)

        @rule(run_id=runs)
        def record_running(self, run_id: str) -> None:
            def act(run: Any) -> str:
                return repo.record_running(
                    run_id=run.id, attempt_id=run.latest_attempt.id, handle=HANDLE, started_at_ms=1
                ).status

            self._apply(run_id, act, 2)

        @rule(run_id=runs, lost=st.booleans())
        def fail(self, run_id: str, lost: bool) -> None:
            def act(run: Any) -> str:
                return repo.fail_attempt(
                    run_id=run.id, attempt_id=run.latest_attempt.id,
                    error_code=ErrorCode.EXECUTOR_START_FAILED, lost=lost,
                ).status  # fmt: skip

            self._apply(run_id, act, 2)

        @rule(run_id=runs, code=st.sampled_from([0, 1, 255]), seq=st.integers(0, 2))
        def complete(self, run_id: str, code: int, seq: int) -> None:
            run = reader.get_run(run_id)
            outcome = repo.complete_attempt(
                run_id=run.id, attempt_id=run.latest_attempt.id, token=TOKEN,  # type: ignore[union-attr]
                callback_sequence=seq, exit_code=code, signal=None, finished_at_ms=1,
            )  # fmt: skip
            model = self.expected[run_id]
            if outcome.status == "applied":
                assert model["status"] not in TERMINAL_RUN
                # From dispatching the running step is recorded first: two more events.
                model["version"] += 4 if run.status == "dispatching" else 2
                model["status"] = outcome.run_status
            else:
                after = reader.get_run(run_id)
                assert (after.status, after.version) == (run.status, run.version)

        @rule(run_id=runs, reason=st.sampled_from(["user", "timeout"]))
        def cancel(self, run_id: str, reason: Any) -> None:
            def steps(before: Any, after: str) -> int:
                if before.cancel is not None:
                    return 0
                return 3 if before.status == "queued" else 1

            self._apply(
                run_id, lambda run: repo.request_cancel(run_id=run.id, reason=reason).status, steps
            )

        @invariant()
        def history_matches_the_model(self) -> None:
            for run_id, model in self.expected.items():
                run = reader.get_run(run_id)
                events = reader.list_events(run_id, limit=1000).items
                assert [e.seq for e in events] == list(range(1, len(events) + 1))
                assert run.version == len(events) == model["version"]
                assert run.status == model["status"]
                if run.status in TERMINAL_RUN:
                    assert events[-1].type == f"run.{run.status}"

    run_state_machine_as_test(
        RunMachine,
        settings=settings(
            max_examples=15,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
