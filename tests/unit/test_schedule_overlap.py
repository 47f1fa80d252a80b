"""Overlap decisions of a due slot (docs/schedules.md §5), pure: the active runs in, the answer out."""

from __future__ import annotations

from dataclasses import replace
from typing import cast

from app.context.schedule_loop import ScheduleLoop
from app.domain.ids import uuid7
from app.domain.model import Run
from app.domain.states import RunStatus
from app.schedule.overlap import ActiveRun, OverlapDecision, decide_overlap
from app.storage.schedules_repo import FireResult, ScheduleRepository
from tests.unit.test_intent_hooks import _facade, _Intents, _Runs
from tests.unit.test_scheduling_loop import FakeRepo

RUNNING = ActiveRun("a", 1000, "running", cancel_requested=False)
WAITING = ActiveRun("b", 2000, "queued", cancel_requested=False)


def test_no_active_run_fires_under_every_policy() -> None:
    for policy in ("skip", "allow", "queue_one", "replace"):
        assert decide_overlap(policy, 1, []) == OverlapDecision("fired", creates=True)


def test_skip_and_allow_count_active_runs_against_their_limit() -> None:
    assert decide_overlap("skip", 5, [RUNNING]) == OverlapDecision(
        "skipped_overlap", blocking_run="a"
    )
    assert decide_overlap("allow", 2, [RUNNING]).kind == "fired"
    assert decide_overlap("allow", 2, [RUNNING, WAITING]) == OverlapDecision(
        "skipped_overlap", blocking_run="a"
    )


def test_queue_one_lets_one_run_wait_held_behind_the_active_one_and_skips_a_further_slot() -> None:
    assert decide_overlap("queue_one", 1, [RUNNING]) == OverlapDecision(
        "queued", creates=True, hold_from_slot_ms=1000
    )
    assert decide_overlap("queue_one", 1, [RUNNING, WAITING]) == OverlapDecision(
        "skipped_overlap", blocking_run="a"
    )
    # A run waiting for a budget (queued, not started) is active too: the new one waits behind it.
    assert decide_overlap("queue_one", 1, [WAITING]).hold_from_slot_ms == 2000


def test_replace_cancels_the_active_run_and_holds_the_new_one_until_it_ended() -> None:
    assert decide_overlap("replace", 1, [RUNNING]) == OverlapDecision(
        "replaced", creates=True, hold_from_slot_ms=1000, cancel=("a",)
    )


def test_replace_cancels_a_waiting_replacement_at_once_and_does_not_cancel_twice() -> None:
    stopping = ActiveRun("a", 1000, "running", cancel_requested=True)
    decision = decide_overlap("replace", 1, [stopping, WAITING])
    # The waiting one never started: cancelled now; the running one already has its intent.
    assert decision == OverlapDecision(
        "replaced", creates=True, hold_from_slot_ms=1000, cancel=("b",)
    )


def test_replace_of_only_a_queued_run_needs_no_hold() -> None:
    # The queued run ends cancelled in the same transaction: nothing is left to wait for.
    assert decide_overlap("replace", 1, [WAITING]) == OverlapDecision(
        "replaced", creates=True, hold_from_slot_ms=None, cancel=("b",)
    )


def test_a_pass_that_replaced_a_started_run_wakes_the_worker_and_kicks_the_drain() -> None:
    calls: list[str] = []
    result = FireResult(runs_created=1, schedules_decided=1, page_full=False, cancels_requested=1)
    repo = FakeRepo(None, result)
    loop = ScheduleLoop(
        cast(ScheduleRepository, repo),
        on_fired=lambda: calls.append("drain"),
        on_cancel_requested=lambda: calls.append("wake worker"),
    )
    loop.pass_once()
    assert calls == ["wake worker", "drain"]


def test_a_cancel_that_ended_a_queued_scheduled_run_drains_for_the_run_held_behind_it() -> None:
    class ScheduledRuns(_Runs):
        def request_cancel(self, *, run_id: str, reason: str) -> Run:
            ended = super().request_cancel(run_id=run_id, reason=reason)
            return replace(ended, trigger_kind="schedule", schedule="tick", slot_ms=1000)

    intents = _Intents()
    _facade(ScheduledRuns(RunStatus.CANCELLED), intents).request_cancel(run_id=uuid7())
    assert intents.calls == ["enqueued"]
