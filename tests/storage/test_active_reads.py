"""The reconciler's and worker's reads of active (starting or running) attempts."""

from __future__ import annotations

from sqlalchemy import Engine

from app.domain.canonical import sha256_digest
from app.domain.errors import ErrorCode
from app.domain.model import Run
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from tests.storage.helpers import HANDLE, TOKEN, define_task, dispatch, enqueue, start


def _attempt_id(run: Run) -> str:
    assert run.latest_attempt is not None
    return run.latest_attempt.id


def test_only_starting_and_running_attempts_are_active(engine: Engine) -> None:
    define_task(engine)
    repo, reader = RunRepository(engine), RunReader(engine)
    queued = enqueue(engine)
    starting = dispatch(engine, enqueue(engine))
    running = start(engine, enqueue(engine))
    failed = dispatch(engine, enqueue(engine))
    repo.fail_attempt(
        run_id=failed.id, attempt_id=_attempt_id(failed), error_code=ErrorCode.EXECUTOR_START_FAILED
    )
    ids = {name: _attempt_id(r) for name, r in [
        ("queued", queued), ("starting", starting), ("running", running), ("failed", failed),
    ]}  # fmt: skip
    live = sorted([ids["starting"], ids["running"]])

    assert [a.attempt_id for a in reader.active_attempts(limit=10)] == live
    assert [a.attempt_id for a in reader.active_attempts(limit=1)] == live[:1]
    assert [a.attempt_id for a in reader.active_attempts(limit=10, after_id=live[0])] == live[1:]
    assert sorted(reader.active_among(list(ids.values()))) == live
    assert reader.active_among([]) == {}
    for name in ("queued", "failed"):
        assert reader.active_attempt(ids[name]) is None
    assert reader.active_attempt("no-such-attempt") is None
    one = reader.active_attempt(ids["running"])
    assert one is not None
    assert (one.run_id, one.status, one.run_status) == (running.id, "running", "running")
    assert (one.handle, one.handle_invalid, one.cancel_reason) == (HANDLE, False, None)
    assert reader.active_among([ids["running"]]) == {ids["running"]: one}


def test_stop_candidates_are_active_attempts_past_their_deadline_or_with_a_cancel_intent(
    engine: Engine,
) -> None:
    define_task(engine)
    repo, reader = RunRepository(engine), RunReader(engine)
    plain = start(engine, enqueue(engine))
    cancelled = start(engine, enqueue(engine))
    repo.request_cancel(run_id=cancelled.id, reason="user")
    queued_cancel = enqueue(engine)
    repo.request_cancel(run_id=queued_cancel.id, reason="user")  # ends at once: not active
    timed = enqueue(engine)
    repo.begin_dispatch(
        run_id=timed.id, attempt_id=_attempt_id(timed), expected_version=timed.version,
        token_digest=sha256_digest(TOKEN.encode()), deadline_at_ms=5_000, log_artifact_id="log",
    )  # fmt: skip
    assert [a.attempt_id for a in reader.stop_candidates(now_ms=4_999, limit=10)] == [
        _attempt_id(cancelled)
    ]
    assert [a.attempt_id for a in reader.stop_candidates(now_ms=5_000, limit=10)] == sorted(
        [_attempt_id(cancelled), _attempt_id(timed)]
    )
    assert reader.stop_candidates(now_ms=0, limit=10)[0].cancel_reason == "user"
    assert reader.stop_candidates(now_ms=0, limit=10, after_id=_attempt_id(cancelled)) == []
    assert len(reader.stop_candidates(now_ms=5_000, limit=1)) == 1
    assert _attempt_id(plain) not in {
        a.attempt_id for a in reader.stop_candidates(now_ms=2**62, limit=10)
    }  # no deadline: only an intent makes it a candidate
