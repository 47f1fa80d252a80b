"""Deadlines and cancel intents end runs through the committed intent (docs/design.md §3.14).

The worker commits ``run.cancel_requested`` (reason timeout) before it signals; the shim's
receipt then maps to ``timed_out``/``cancelled`` whatever the exit code. Jobs trap nothing
and are gated on files, so every step is a bounded poll of a real state.
"""

from __future__ import annotations

import pytest
from sqlalchemy import update

from app.domain.errors import Conflict, ErrorCode
from app.domain.ids import now_ms
from app.storage.tables import attempts
from app.worker.identity import wait_exit
from tests.recovery.kit import DEADLINE, Armed, Rig, gated, terminal_events, wait_for


def _ended(rig: Rig, a: Armed, status: str) -> None:
    run = rig.wait_status(a)
    assert run.status == status
    assert terminal_events(rig.engine, a.run_id) == [f"attempt.{status}", f"run.{status}"]


def _intent_before_ending(rig: Rig, a: Armed, reason: str) -> None:
    types = rig.event_types(a)
    events = rig.reader.list_events(a.run_id, limit=1000).items
    intent = [e for e in events if e.type == "run.cancel_requested"]
    assert len(intent) == 1 and intent[0].data == {"reason": reason}
    assert types.index("run.cancel_requested") < types.index(types[-1])


def test_an_expired_deadline_commits_the_intent_then_stops_the_job(rig: Rig) -> None:
    rig.worker.start()
    a = rig.arm(deadline_at_ms=now_ms() + 300)
    h = rig.launch(a, gated("never", then="exit 0"))
    _ended(rig, a, "timed_out")
    _intent_before_ending(rig, a, "timeout")
    assert wait_exit(h.pid, DEADLINE)
    run = rig.run(a)
    assert run.latest_attempt is not None and run.latest_attempt.signal is not None


def test_a_deadline_that_passed_while_the_worker_was_down_times_out_after_restart(
    rig: Rig,
) -> None:
    rig.worker.start()
    deadline = now_ms() + 60_000
    a = rig.arm(deadline_at_ms=deadline)
    h = rig.launch(a, gated("never", then="exit 0"))
    rig.kill_worker()
    # Named point: the persisted deadline passes while nobody watches (no clock waiting).
    with rig.engine.begin() as conn:
        conn.execute(
            update(attempts).where(attempts.c.id == a.attempt_id).values(deadline_at_ms=now_ms())
        )
    assert rig.run(a).status == "running"
    rig.worker.start()
    _ended(rig, a, "timed_out")
    _intent_before_ending(rig, a, "timeout")
    assert wait_exit(h.pid, DEADLINE)


def test_a_user_cancel_stops_the_job_and_the_run_is_cancelled(rig: Rig) -> None:
    rig.worker.start()
    a = rig.arm()
    h = rig.launch(a, gated("never", then="exit 0"))
    rig.runs.request_cancel(run_id=a.run_id, reason="user")  # what the api commits
    assert rig.worker.client.wake()
    _ended(rig, a, "cancelled")
    assert wait_exit(h.pid, DEADLINE)


def test_intent_committed_before_the_receipt_is_consumed_wins(rig: Rig) -> None:
    a = rig.ended_while_down("exit 0")  # a success receipt is published, not consumed
    assert rig.store.path_of(a.attempt_id).exists()
    rig.runs.request_cancel(run_id=a.run_id, reason="user")
    rig.worker.start()
    _ended(rig, a, "cancelled")
    run = rig.run(a)
    assert run.latest_attempt is not None and run.latest_attempt.exit_code == 0
    wait_for(lambda: not rig.store.path_of(a.attempt_id).exists(), "the receipt cleanup")


def test_receipt_consumed_before_the_intent_keeps_success(rig: Rig) -> None:
    rig.worker.start()
    a = rig.arm()
    rig.launch(a, gated("g", then="exit 0"))
    rig.gate("g").touch()
    _ended(rig, a, "succeeded")
    with pytest.raises(Conflict) as info:
        rig.runs.request_cancel(run_id=a.run_id, reason="user")
    assert info.value.code == ErrorCode.RUN_TERMINAL
    assert "run.cancel_requested" not in rig.event_types(a)
