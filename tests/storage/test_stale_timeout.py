"""A timeout read for attempt n never ends the run once attempt n ended and a retry waits.

The worker's cancellation sweep reads a page of attempts past their deadline, then commits
``timeout`` intents one by one by run id. Before retries a run whose attempt ended meanwhile
was terminal (RUN_TERMINAL: skipped). With retries the run is ``queued`` again, waiting for
attempt n+1; the intent must not end that retry ``timed_out`` before it ever started,
outside the retry rule (docs/retries.md §2). Today the state machine refuses it (a
``claimed`` attempt cannot become ``timed_out``, so the intent rolls back and the sweep
skips the run); this test keeps it so.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from app.domain.canonical import sha256_digest
from app.domain.ids import now_ms
from app.domain.profiles import EDGE
from app.domain.retry import RetryPolicy
from app.execution.cancellation import CancellationSweep
from app.storage.definitions_repo import DefinitionRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from tests.storage.helpers import HANDLE, TOKEN, enqueue, event_types


class _StalePage:
    """The page the sweep read just before the attempt ended."""

    def __init__(self, page: list[Any]) -> None:
        self._page = page

    def stop_candidates(self, **_: Any) -> list[Any]:
        return self._page


class _NoStops:
    def __init__(self) -> None:
        self.stops: list[Any] = []

    def stop(self, handle: Any, **_: Any) -> str:
        self.stops.append(handle)
        return "stopped"


def test_a_stale_timeout_of_an_ended_attempt_leaves_its_waiting_retry_alone(
    engine: Engine,
) -> None:
    DefinitionRepository(engine).put_revision(
        task="job", revision=1, executor="local_process", argv=["/bin/true"], cwd=None,
        recipe=None, timeout_seconds=1, priority=0,
        retry=RetryPolicy(max_attempts=2, initial_delay_seconds=3600, max_delay_seconds=3600),
    )  # fmt: skip
    repo, reader = RunRepository(engine), RunReader(engine)
    run = enqueue(engine)
    assert run.latest_attempt is not None
    attempt_id = run.latest_attempt.id
    repo.begin_dispatch(
        run_id=run.id, attempt_id=attempt_id, expected_version=run.version,
        token_digest=sha256_digest(TOKEN.encode()), deadline_at_ms=now_ms() - 1,
        log_artifact_id="log:" + attempt_id,
    )  # fmt: skip
    repo.record_running(run_id=run.id, attempt_id=attempt_id, handle=HANDLE, started_at_ms=now_ms())
    stale = reader.stop_candidates(now_ms=now_ms(), limit=8)
    assert [a.attempt_id for a in stale] == [attempt_id]  # past its deadline, no intent yet
    # The job fails right at its deadline: attempt 1 ends, attempt 2 waits (one step).
    outcome = repo.complete_attempt(
        run_id=run.id, attempt_id=attempt_id, token=TOKEN, callback_sequence=1,
        exit_code=3, signal=None, finished_at_ms=now_ms(),
    )  # fmt: skip
    assert outcome.run_status == "queued"

    controller = _NoStops()
    sweep = CancellationSweep(
        attempts=_StalePage(stale),  # type: ignore[arg-type]
        intents=repo,
        controller=controller,  # type: ignore[arg-type]
        profile=EDGE,
    )
    sweep.run_once()

    waiting = reader.get_run(run.id)
    assert waiting.latest_attempt is not None
    assert (waiting.status, waiting.attempts, waiting.latest_attempt.status) == (
        "queued", 2, "claimed",
    )  # fmt: skip
    assert waiting.cancel is None
    assert event_types(engine, run.id)[-2:] == ["run.retry_scheduled", "attempt.claimed"]
    assert controller.stops == []


def test_a_stale_timeout_of_an_ended_attempt_does_not_time_out_the_retry_now_running(
    engine: Engine,
) -> None:
    # The same stale page, but the retry (no delay) was already promoted and started before
    # the sweep got to the run: an intent recorded by run id would stop attempt 2, whose own
    # deadline is far away, as ``timed_out``.
    DefinitionRepository(engine).put_revision(
        task="job", revision=1, executor="local_process", argv=["/bin/true"], cwd=None,
        recipe=None, timeout_seconds=1, priority=0,
        retry=RetryPolicy(max_attempts=2, initial_delay_seconds=0, max_delay_seconds=0),
    )  # fmt: skip
    repo, reader = RunRepository(engine), RunReader(engine)
    run = enqueue(engine)
    assert run.latest_attempt is not None
    first = run.latest_attempt.id
    _start(repo, run.id, first, run.version, deadline_at_ms=now_ms() - 1)
    stale = reader.stop_candidates(now_ms=now_ms(), limit=8)
    assert [a.attempt_id for a in stale] == [first]
    repo.complete_attempt(
        run_id=run.id, attempt_id=first, token=TOKEN, callback_sequence=1,
        exit_code=3, signal=None, finished_at_ms=now_ms(),
    )  # fmt: skip
    assert repo.promote_due_retries(limit=8) == 1
    queued = reader.get_run(run.id)
    assert queued.latest_attempt is not None
    _start(repo, run.id, queued.latest_attempt.id, queued.version, deadline_at_ms=None)

    CancellationSweep(
        attempts=_StalePage(stale),  # type: ignore[arg-type]
        intents=repo,
        controller=_NoStops(),  # type: ignore[arg-type]
        profile=EDGE,
    ).run_once()

    running = reader.get_run(run.id)
    assert (running.status, running.attempts, running.cancel) == ("running", 2, None)
    assert "run.cancel_requested" not in event_types(engine, run.id)


def _start(
    repo: RunRepository, run_id: str, attempt_id: str, version: int, *, deadline_at_ms: int | None
) -> None:
    repo.begin_dispatch(
        run_id=run_id, attempt_id=attempt_id, expected_version=version,
        token_digest=sha256_digest(TOKEN.encode()), deadline_at_ms=deadline_at_ms,
        log_artifact_id="log:" + attempt_id,
    )  # fmt: skip
    repo.record_running(run_id=run_id, attempt_id=attempt_id, handle=HANDLE, started_at_ms=now_ms())
