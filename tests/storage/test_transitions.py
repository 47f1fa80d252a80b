"""Repository transitions on SQLite and PostgreSQL: CAS, one event per step, refusals."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select

from app.domain.errors import Conflict, ErrorCode, InvalidTransition, NotFound, VersionConflict
from app.domain.retry import RetryPolicy
from app.storage.definitions_repo import DefinitionRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.storage.tables import run_events
from tests.kit.crash import crash_in_step
from tests.storage.helpers import (
    HANDLE,
    TOKEN,
    define_task,
    dispatch,
    enqueue,
    event_types,
    start,
)


def test_enqueue_creates_a_queued_run_with_a_claimed_attempt_and_one_event(engine: Engine) -> None:
    define_task(engine)
    run = enqueue(engine)
    assert (run.status, run.version) == ("queued", 1)
    assert run.latest_attempt is not None
    assert (run.latest_attempt.number, run.latest_attempt.status) == (1, "claimed")
    assert event_types(engine, run.id) == ["run.queued"]


def test_enqueue_of_unknown_task_or_revision_is_refused(engine: Engine) -> None:
    repo = RunRepository(engine)
    with pytest.raises(NotFound) as info:
        repo.enqueue_run(task="nope", revision=None, priority=None)
    assert info.value.code == ErrorCode.TASK_NOT_FOUND
    define_task(engine)
    with pytest.raises(NotFound) as info:
        repo.enqueue_run(task="job", revision=9, priority=None)
    assert info.value.code == ErrorCode.REVISION_NOT_FOUND


def test_idempotency_key_returns_the_first_run_and_refuses_another_body(engine: Engine) -> None:
    define_task(engine)
    repo = RunRepository(engine)
    kwargs = {"task": "job", "revision": None, "priority": None, "token_id": "t1"}
    first, created = repo.enqueue_run(**kwargs, idempotency_key="k", request_digest="d1")
    again, created_again = repo.enqueue_run(**kwargs, idempotency_key="k", request_digest="d1")
    assert created and not created_again and again.id == first.id
    with pytest.raises(Conflict) as info:
        repo.enqueue_run(**kwargs, idempotency_key="k", request_digest="d2")
    assert info.value.code == ErrorCode.IDEMPOTENCY_KEY_REUSED
    other, created_other = repo.enqueue_run(
        **{**kwargs, "token_id": "t2"}, idempotency_key="k", request_digest="d1"
    )
    assert created_other and other.id != first.id


def test_full_success_path_appends_one_event_per_step(engine: Engine) -> None:
    define_task(engine)
    run = start(engine, enqueue(engine))
    assert (run.status, run.version) == ("running", 5)
    assert run.latest_attempt is not None
    outcome = RunRepository(engine).complete_attempt(
        run_id=run.id, attempt_id=run.latest_attempt.id, token=TOKEN, callback_sequence=1,
        exit_code=0, signal=None, finished_at_ms=run.created_at_ms + 5,
    )  # fmt: skip
    assert (outcome.status, outcome.run_status) == ("applied", "succeeded")
    assert event_types(engine, run.id) == [
        "run.queued", "run.dispatching", "attempt.starting", "attempt.running",
        "run.running", "attempt.succeeded", "run.succeeded",
    ]  # fmt: skip
    assert RunReader(engine).get_run(run.id).version == 7


def test_the_leftovers_count_lands_in_the_attempts_terminal_event_only(engine: Engine) -> None:
    define_task(engine)
    run = start(engine, enqueue(engine))
    assert run.latest_attempt is not None
    RunRepository(engine).complete_attempt(
        run_id=run.id, attempt_id=run.latest_attempt.id, token=TOKEN, callback_sequence=1,
        exit_code=0, signal=None, finished_at_ms=run.created_at_ms + 5, leftovers_stopped=2,
    )  # fmt: skip
    events = RunReader(engine).list_events(run.id, limit=100).items
    assert [e.data for e in events if e.type == "attempt.succeeded"] == [
        {"attempt": 1, "exit_code": 0, "signal": None, "leftovers_stopped": 2}
    ]
    assert all("leftovers_stopped" not in e.data for e in events if e.type != "attempt.succeeded")


def test_completion_is_applied_once_and_checks_token_and_sequence(engine: Engine) -> None:
    define_task(engine)
    run = start(engine, enqueue(engine))
    assert run.latest_attempt is not None
    repo = RunRepository(engine)
    common = {"run_id": run.id, "attempt_id": run.latest_attempt.id, "finished_at_ms": 1}
    wrong = repo.complete_attempt(
        **common, token="forged", callback_sequence=1, exit_code=0, signal=None
    )
    assert (wrong.status, wrong.reason) == ("rejected", "WRONG_TOKEN")
    zero = repo.complete_attempt(
        **common, token=TOKEN, callback_sequence=0, exit_code=0, signal=None
    )
    assert (zero.status, zero.reason) == ("rejected", "WRONG_SEQUENCE")
    killed = repo.complete_attempt(
        **common, token=TOKEN, callback_sequence=1, exit_code=137, signal=9
    )
    assert (killed.status, killed.run_status) == ("applied", "failed")
    replay = repo.complete_attempt(
        **common, token=TOKEN, callback_sequence=1, exit_code=0, signal=None
    )
    assert replay.status == "already_terminal"
    attempt = RunReader(engine).get_run(run.id).latest_attempt
    assert attempt is not None
    assert (attempt.exit_code, attempt.signal, attempt.status) == (None, 9, "failed")
    # Finishing times never precede the committed start.
    assert attempt.finished_at_ms is not None and attempt.started_at_ms is not None
    assert attempt.finished_at_ms >= attempt.started_at_ms
    assert event_types(engine, run.id)[-2:] == ["attempt.failed", "run.failed"]


def test_cancel_of_a_queued_run_ends_it_at_once_and_is_idempotent(engine: Engine) -> None:
    define_task(engine)
    run = enqueue(engine)
    repo = RunRepository(engine)
    cancelled = repo.request_cancel(run_id=run.id, reason="user")
    assert cancelled.status == "cancelled" and cancelled.cancel is not None
    assert event_types(engine, run.id) == [
        "run.queued",
        "run.cancel_requested",
        "attempt.cancelled",
        "run.cancelled",
    ]
    with pytest.raises(Conflict) as info:
        repo.request_cancel(run_id=run.id, reason="user")
    assert info.value.code == ErrorCode.RUN_TERMINAL


def test_cancel_intent_on_a_running_run_decides_its_ending(engine: Engine) -> None:
    define_task(engine)
    run = start(engine, enqueue(engine))
    repo = RunRepository(engine)
    first = repo.request_cancel(run_id=run.id, reason="timeout")
    second = repo.request_cancel(run_id=run.id, reason="user")
    assert first.status == "running" and first.version == run.version + 1
    assert second.version == first.version  # recorded once
    assert second.cancel is not None and second.cancel.reason == "timeout"
    assert run.latest_attempt is not None
    outcome = repo.complete_attempt(
        run_id=run.id, attempt_id=run.latest_attempt.id, token=TOKEN, callback_sequence=1,
        exit_code=0, signal=None, finished_at_ms=0,
    )  # fmt: skip
    # A success arriving after an accepted timeout intent cannot win.
    assert outcome.run_status == "timed_out"


def test_refused_transitions_change_nothing(engine: Engine) -> None:
    define_task(engine)
    run = enqueue(engine)
    assert run.latest_attempt is not None
    repo = RunRepository(engine)
    with pytest.raises(InvalidTransition):
        repo.record_running(
            run_id=run.id, attempt_id=run.latest_attempt.id,
            handle=HANDLE, started_at_ms=1,
        )  # fmt: skip
    with pytest.raises(InvalidTransition):
        repo.fail_attempt(
            run_id=run.id, attempt_id=run.latest_attempt.id,
            error_code=ErrorCode.RECOVERY_START_NOT_SPAWNED, lost=True,
        )  # fmt: skip
    after = RunReader(engine).get_run(run.id)
    assert (after.status, after.version) == ("queued", 1)
    assert event_types(engine, run.id) == ["run.queued"]


def test_second_begin_dispatch_of_the_same_attempt_is_refused(engine: Engine) -> None:
    define_task(engine)
    run = enqueue(engine)
    dispatch(engine, run)
    with pytest.raises(VersionConflict):  # the version it was listed at is gone
        dispatch(engine, run)
    with pytest.raises(InvalidTransition) as refused:  # at the new version: already armed
        dispatch(engine, RunReader(engine).get_run(run.id))
    assert refused.value.code == ErrorCode.INVALID_TRANSITION


def test_crash_inside_a_transaction_leaves_nothing_half_written(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    define_task(engine)
    run = enqueue(engine)
    # Run and attempt rows (and on PostgreSQL the events) are written when this raises.
    crash_in_step(monkeypatch, engine, "injected crash inside T1, before its commit")
    with pytest.raises(RuntimeError, match="injected"):
        dispatch(engine, run)
    monkeypatch.undo()
    after = RunReader(engine).get_run(run.id)
    assert (after.status, after.version) == ("queued", 1)
    assert after.latest_attempt is not None and after.latest_attempt.status == "claimed"
    assert event_types(engine, run.id) == ["run.queued"]
    # And the same transition then succeeds normally.
    assert dispatch(engine, after).status == "dispatching"


@pytest.mark.parametrize("threads", [2, 8])
def test_compare_and_set_race_has_exactly_one_winner(engine: Engine, threads: int) -> None:
    define_task(engine)
    run = enqueue(engine)
    barrier = threading.Barrier(threads)
    results: list[str] = []
    lock = threading.Lock()

    def contender() -> None:
        barrier.wait()
        try:
            dispatch(engine, run)
            outcome = "won"
        except (VersionConflict, InvalidTransition):
            outcome = "lost"
        with lock:
            results.append(outcome)

    workers = [threading.Thread(target=contender) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert sorted(results) == ["lost"] * (threads - 1) + ["won"]
    with engine.connect() as conn:
        count = conn.execute(
            select(func.count()).select_from(run_events).where(run_events.c.run_id == run.id)
        ).scalar_one()
    assert count == 3
    assert RunReader(engine).get_run(run.id).version == 3


def test_each_transition_returns_exactly_what_a_fresh_read_sees(engine: Engine) -> None:
    # Enqueue, T1 and T2 build their returned run from what they wrote instead of reading it
    # back inside the writer lock; it must be the stored run, field for field.
    define_task(engine, priority=3)
    reader = RunReader(engine)
    queued = enqueue(engine)
    assert queued == reader.get_run(queued.id)
    dispatching = dispatch(engine, queued)
    assert dispatching == reader.get_run(queued.id)
    assert dispatching.latest_attempt is not None
    assert dispatching.latest_attempt.log_artifact_id == "log:" + dispatching.latest_attempt.id
    running = RunRepository(engine).record_running(
        run_id=queued.id,
        attempt_id=dispatching.latest_attempt.id,
        handle=HANDLE,
        started_at_ms=queued.created_at_ms + 1,
    )
    assert running == reader.get_run(queued.id)
    assert (running.status, running.version, running.priority) == ("running", 5, 3)
    assert running.started_at_ms is not None


def test_fail_and_cancel_return_exactly_what_a_fresh_read_sees(engine: Engine) -> None:
    # Like T1 and T2, they build their returned run from what they wrote.
    define_task(engine)
    reader, repo = RunReader(engine), RunRepository(engine)
    dispatching = dispatch(engine, enqueue(engine))
    assert dispatching.latest_attempt is not None
    lost = repo.fail_attempt(
        run_id=dispatching.id, attempt_id=dispatching.latest_attempt.id,
        error_code=ErrorCode.EXECUTOR_START_FAILED, lost=True,
    )  # fmt: skip
    assert lost == reader.get_run(lost.id)
    assert lost.latest_attempt is not None
    assert (lost.status, lost.latest_attempt.error_code) == ("lost", "EXECUTOR_START_FAILED")
    cancelled = repo.request_cancel(run_id=enqueue(engine).id, reason="user")
    assert cancelled == reader.get_run(cancelled.id)
    assert cancelled.latest_attempt is not None
    assert (cancelled.status, cancelled.latest_attempt.status) == ("cancelled", "cancelled")
    running = start(engine, enqueue(engine))
    intent = repo.request_cancel(run_id=running.id, reason="user")
    assert intent == reader.get_run(running.id)
    assert intent.status == "running" and intent.cancel is not None
    again = repo.request_cancel(run_id=running.id, reason="timeout")
    assert again == intent == reader.get_run(running.id)


def test_cancel_racing_t1_on_a_queued_run_is_a_clean_cas_loss_never_a_deadlock(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Cancel of a queued run and T1 both write the run row and the attempt row. Each pauses
    # after its first write until the other wrote too (or 0.5 s passed): with the rows taken
    # in opposite orders PostgreSQL would find a deadlock and abort one with a database error.
    # Both lock the run row first, so one simply loses the compare-and-set.
    import app.storage.runs_repo as runs_repo

    define_task(engine)
    run = enqueue(engine)
    barrier = threading.Barrier(2, timeout=0.5)
    local = threading.local()

    def after_first_write(write: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            written = write(*args, **kwargs)
            if not getattr(local, "wrote", False):
                local.wrote = True
                with contextlib.suppress(threading.BrokenBarrierError):
                    barrier.wait()
            return written

        return wrapped

    monkeypatch.setattr(runs_repo, "_cas_run", after_first_write(runs_repo._cas_run))
    monkeypatch.setattr(runs_repo, "_update_attempt", after_first_write(runs_repo._update_attempt))
    # PostgreSQL's T1 writes run, attempt and events in one statement (one_step.py).
    monkeypatch.setattr(runs_repo, "write_step", after_first_write(runs_repo.write_step))
    results: dict[str, object] = {}

    def contend(name: str, action: Any) -> None:
        try:
            results[name] = action().status
        except Exception as exc:  # the outcome is what is asserted
            results[name] = exc

    repo = RunRepository(engine)
    threads = [
        threading.Thread(
            target=contend,
            args=("cancel", lambda: repo.request_cancel(run_id=run.id, reason="user")),
        ),
        threading.Thread(target=contend, args=("dispatch", lambda: dispatch(engine, run))),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    # At most one side loses, and only the compare-and-set (SQLite serializes the writers: a
    # T1 that went first leaves the cancel an intent on a dispatching run, and both succeed).
    errors = [r for r in results.values() if isinstance(r, Exception)]
    assert len(results) == 2 and len(errors) <= 1, results
    assert all(isinstance(e, VersionConflict) for e in errors), results
    final = RunReader(engine).get_run(run.id)
    assert final.status in ("cancelled", "dispatching")
    assert final.version == len(RunReader(engine).list_events(run.id).items)


class _StallAfterRead:
    """Stalls the first SELECT of the thread that calls ``arm()`` until ``release``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._armed = threading.local()
        self.stalled, self.release = threading.Event(), threading.Event()

    def arm(self) -> None:
        self._armed.on = True

    def _after(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if getattr(self._armed, "on", False) and statement.lstrip().startswith("SELECT"):
            self._armed.on = False
            self.stalled.set()
            assert self.release.wait(10)

    def __enter__(self) -> _StallAfterRead:
        event.listen(self._engine, "after_cursor_execute", self._after)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        event.remove(self._engine, "after_cursor_execute", self._after)


def test_a_completion_meeting_record_running_waits_for_it_and_applies_at_the_first_try(
    engine: Engine,
) -> None:
    # A trivial job's ending often reaches the worker while the api is still recording it
    # running (T2). Once the completion read the pair unlocked, the torn pair raised
    # InvalidTransition; read in one statement, the completion still read the old version,
    # lost its CAS to T2 and did it all again (about one rollback every other run in a
    # PostgreSQL burst). Now the pair read locks the run (PostgreSQL; SQLite's writer lock
    # already did): T2 stalls right after its read, the completion must wait for T2's commit
    # and apply its ending on the first try, once.
    define_task(engine)
    repo = RunRepository(engine)
    run = dispatch(engine, enqueue(engine))
    assert run.latest_attempt is not None
    attempt_id = run.latest_attempt.id
    stall = _StallAfterRead(engine)
    done: list[Any] = []

    def running() -> None:
        stall.arm()
        repo.record_running(run_id=run.id, attempt_id=attempt_id, handle=HANDLE, started_at_ms=1)

    def completing() -> None:
        try:
            outcome = repo.complete_attempt(
                run_id=run.id, attempt_id=attempt_id, token=TOKEN, callback_sequence=1,
                exit_code=0, signal=None, finished_at_ms=2, started_at_ms=1,
            )  # fmt: skip
            done.append(outcome)
        except Exception as exc:  # a VersionConflict here is the defect this test is for
            done.append(exc)

    t2 = threading.Thread(target=running)
    completion = threading.Thread(target=completing)
    with stall:
        t2.start()
        assert stall.stalled.wait(10)
        completion.start()
        completion.join(0.3)
        assert done == []  # waiting for T2, not deciding on the version T2 is replacing
        stall.release.set()
        completion.join(10)
        t2.join(10)
    assert [getattr(o, "status", o) for o in done] == ["applied"]
    final = RunReader(engine).get_run(run.id)
    assert final.status == "succeeded"
    types = event_types(engine, run.id)
    assert types.count("run.running") == 1 and types.count("run.succeeded") == 1


def test_a_transition_that_waited_for_a_retry_being_scheduled_finds_the_attempt_superseded(
    engine: Engine,
) -> None:
    # The locked pair read waits for the completion, which ends attempt 1 and appends the
    # retry's attempt 2. On PostgreSQL the re-check of the join (attempt number = the run's
    # latest) then drops the row: read once more, T2 must learn that its attempt is no
    # longer the latest (ATTEMPT_NOT_FOUND), not that the run does not exist.
    DefinitionRepository(engine).put_revision(
        task="job", revision=1, executor="local_process", argv=["/bin/true"], cwd=None,
        recipe=None, timeout_seconds=None, priority=0,
        retry=RetryPolicy(max_attempts=2, initial_delay_seconds=0, max_delay_seconds=0),
    )  # fmt: skip
    repo = RunRepository(engine)
    run = dispatch(engine, enqueue(engine))
    assert run.latest_attempt is not None
    attempt_id = run.latest_attempt.id
    stall = _StallAfterRead(engine)

    def completing() -> None:
        stall.arm()
        repo.complete_attempt(
            run_id=run.id, attempt_id=attempt_id, token=TOKEN, callback_sequence=1,
            exit_code=1, signal=None, finished_at_ms=2, started_at_ms=1,
        )  # fmt: skip

    completion = threading.Thread(target=completing)
    with stall:
        completion.start()
        assert stall.stalled.wait(10)
        threading.Timer(0.3, stall.release.set).start()
        with pytest.raises(NotFound) as info:
            repo.record_running(
                run_id=run.id, attempt_id=attempt_id, handle=HANDLE, started_at_ms=1
            )
        completion.join(10)
    assert info.value.code is ErrorCode.ATTEMPT_NOT_FOUND
    after = RunReader(engine).get_run(run.id)
    assert after.status == "queued" and after.latest_attempt is not None
    assert after.latest_attempt.number == 2
