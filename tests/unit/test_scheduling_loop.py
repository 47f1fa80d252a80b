"""The scheduling loop's timer: sleep until the earliest due slot, woken by a change."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

from app.context.schedule_loop import NOTHING_DECIDED_S, ScheduleLoop
from app.domain.ids import now_ms
from app.storage.schedules_repo import FireResult, ScheduleRepository


class FakeRepo:
    """Answers ``fire_due`` and ``earliest_due_ms`` as told; counts the passes."""

    def __init__(self, earliest: int | None, result: FireResult) -> None:
        self.earliest = earliest
        self.result = result
        self.passes = 0
        self.passed = threading.Event()

    def fire_due(self) -> FireResult:
        self.passes += 1
        self.passed.set()
        return self.result

    def earliest_due_ms(self) -> int | None:
        return self.earliest


def loop_of(repo: FakeRepo, fired: list[int] | None = None, **kw: Any) -> ScheduleLoop:
    """A loop over the fake repository."""
    sink = fired if fired is not None else []
    return ScheduleLoop(cast(ScheduleRepository, repo), on_fired=lambda: sink.append(1), **kw)


def test_the_loop_sleeps_until_the_earliest_due_slot_capped() -> None:
    repo = FakeRepo(now_ms() + 5000, FireResult(0, 1, page_full=False))
    assert 4.9 < loop_of(repo).pass_once() <= 5.01
    repo.earliest = now_ms() + 3_600_000
    assert loop_of(repo, max_sleep_s=30).pass_once() == 30
    repo.earliest = None
    assert loop_of(repo, max_sleep_s=30).pass_once() == 30


def test_a_full_page_passes_again_at_once_and_nothing_decided_backs_off() -> None:
    full = FakeRepo(now_ms() - 10, FireResult(32, 32, page_full=True))
    assert loop_of(full).pass_once() == 0.0
    locked = FakeRepo(now_ms() - 10, FireResult(0, 0, page_full=False))
    assert loop_of(locked).pass_once() == NOTHING_DECIDED_S


def test_runs_created_kick_the_drain_and_none_do_not() -> None:
    fired: list[int] = []
    loop_of(FakeRepo(None, FireResult(2, 1, page_full=False)), fired).pass_once()
    loop_of(FakeRepo(None, FireResult(0, 1, page_full=False)), fired).pass_once()
    assert fired == [1]


def test_a_schedule_change_wakes_the_sleeping_loop() -> None:
    repo = FakeRepo(None, FireResult(0, 0, page_full=False))
    loop = loop_of(repo, max_sleep_s=30)
    loop.start()
    try:
        assert repo.passed.wait(5)
        repo.passed.clear()
        started = time.monotonic()
        loop.schedule_changed()
        assert repo.passed.wait(5)
        assert time.monotonic() - started < 1.0
    finally:
        loop.stop()
