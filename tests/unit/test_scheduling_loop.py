"""The scheduling loop's timer: sleep until the earliest due slot, woken by a change."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, cast

import pytest

from app.context import schedule_loop
from app.context.metrics import FIRE_LATENESS
from app.context.schedule_loop import NOTHING_DECIDED_S, ScheduleLoop
from app.domain.errors import NotMigrated
from app.domain.ids import now_ms
from app.storage.schedules_repo import FireResult, ScheduleRepository, SlotLateness


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


def _lateness_samples() -> dict[tuple[str, str, str], float]:
    """This process's fire lateness samples: (name, slot, le) -> value."""
    return {
        (s.name, s.labels["slot"], s.labels.get("le", "")): s.value
        for family in FIRE_LATENESS.collect()
        for s in family.samples
    }


def test_each_decided_slot_is_observed_in_the_fire_lateness_histogram_by_on_time() -> None:
    before = _lateness_samples()
    name = "qinglong_schedule_fire_lateness_seconds"
    count, total, bucket = f"{name}_count", f"{name}_sum", f"{name}_bucket"
    result = FireResult(
        3, 3, page_full=False,
        lateness=(SlotLateness(0.004, True), SlotLateness(0.003, True), SlotLateness(7200.0, False)),
    )  # fmt: skip
    loop_of(FakeRepo(None, result)).pass_once()
    after = _lateness_samples()

    def grew(key: tuple[str, str, str]) -> float:
        return after[key] - before.get(key, 0.0)

    assert grew((count, "on_time", "")) == 2 and grew((count, "caught_up", "")) == 1
    assert abs(grew((total, "on_time", "")) - 0.007) < 1e-9
    assert grew((total, "caught_up", "")) == 7200.0
    # A fire a few ms late lands in the ms buckets; two hours late in the hours ones.
    assert grew((bucket, "on_time", "0.0025")) == 0 and grew((bucket, "on_time", "0.005")) == 2
    assert grew((bucket, "caught_up", "3600.0")) == 0
    assert grew((bucket, "caught_up", "21600.0")) == 1
    # Nothing decided: nothing observed.
    loop_of(FakeRepo(None, FireResult(0, 0, page_full=False))).pass_once()
    assert _lateness_samples() == after


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


class FailingRepo(FakeRepo):
    """Every pass refused (a database not migrated), as ``qinglong api`` meets it."""

    def fire_due(self) -> FireResult:
        self.passes += 1
        if self.passes >= 3:
            self.passed.set()
        raise NotMigrated()


def test_a_pass_that_keeps_failing_is_one_line_not_one_a_second(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schedule_loop, "RETRY_S", 0.01)
    repo = FailingRepo(None, FireResult(0, 0, page_full=False))
    loop = loop_of(repo)
    with caplog.at_level(logging.INFO, logger="qinglong.schedules"):
        loop.start()
        try:
            assert repo.passed.wait(5)
        finally:
            loop.stop()
    assert repo.passes >= 3
    assert caplog.messages == ["schedule pass failed: NotMigrated"]
