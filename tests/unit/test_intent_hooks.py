"""One hook, one meaning: an enqueue drains the dispatcher, a cancel wakes the worker (pure)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from app.context.bootstrap import Background, retry_wake
from app.context.execution_wiring import build_execution
from app.context.facade import AppFacade
from app.domain.ids import now_ms, uuid7
from app.domain.model import CancelIntent, Run
from app.domain.profiles import EDGE
from app.domain.states import RunStatus
from app.settings import Settings
from app.storage.run_reads import RunReader


class _Intents:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def enqueued(self) -> None:
        self.calls.append("enqueued")

    def cancel_requested(self) -> None:
        self.calls.append("cancel_requested")


class _Runs:
    """Answers enqueue and cancel like the repository would, without a database."""

    def __init__(self, cancel_leaves: RunStatus) -> None:
        self.cancel_leaves = cancel_leaves

    def enqueue_run(self, **_: Any) -> tuple[Run, bool]:
        return _run(RunStatus.QUEUED), True

    def request_cancel(self, *, run_id: str, reason: str) -> Run:
        return _run(self.cancel_leaves, cancel=CancelIntent(reason=reason, at_ms=1))


def _run(status: RunStatus, cancel: CancelIntent | None = None) -> Run:
    return Run(
        id=uuid7(), task="t", revision=1, status=status.value, priority=0, version=1,
        created_at_ms=1, started_at_ms=None, finished_at_ms=None, cancel=cancel,
    )  # fmt: skip


def _facade(runs: _Runs, intents: _Intents) -> AppFacade:
    unused = cast(Any, None)
    return AppFacade(
        _definitions=unused, _runs=cast(Any, runs), _reader=unused, _tokens=unused,
        _secrets=unused, _logs=unused, _readiness_probe=unused, _intents=intents,
    )  # fmt: skip


def _enqueue(facade: AppFacade) -> None:
    facade.enqueue_run(
        task="t", revision=None, priority=None, token_id="tok", idempotency_key=None,
        request_digest="d",
    )  # fmt: skip


def test_an_enqueue_asks_for_a_drain_and_never_wakes_the_worker() -> None:
    intents = _Intents()
    _enqueue(_facade(_Runs(RunStatus.RUNNING), intents))
    assert intents.calls == ["enqueued"]


def test_a_cancel_of_a_running_run_wakes_the_worker_and_never_drains() -> None:
    intents = _Intents()
    _facade(_Runs(RunStatus.RUNNING), intents).request_cancel(run_id=uuid7())
    assert intents.calls == ["cancel_requested"]


def test_a_cancel_that_ended_a_queued_run_at_once_neither_wakes_nor_drains() -> None:
    intents = _Intents()
    _facade(_Runs(RunStatus.CANCELLED), intents).request_cancel(run_id=uuid7())
    assert intents.calls == []


def _background(seen: list[str], done: threading.Semaphore) -> Background:
    def hook(name: str) -> Any:
        def call() -> None:
            seen.append(name)
            done.release()

        return call

    return Background(
        on_enqueued=hook("drain"), on_cancel_requested=hook("wake"), periodic=hook("periodic"),
        interval_s=3600.0,
    )  # fmt: skip


def test_the_background_thread_runs_only_the_hook_that_was_kicked() -> None:
    seen: list[str] = []
    done = threading.Semaphore(0)
    background = _background(seen, done)
    background.start()
    try:
        background.enqueued()
        assert done.acquire(timeout=10)
        background.cancel_requested()
        assert done.acquire(timeout=10)
        assert not done.acquire(timeout=0.2)  # nothing else ran
    finally:
        background.stop()
    assert seen == ["drain", "wake"]


class _Worker:
    """The worker client's surface build_execution uses, counting what is asked of it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def ping(self, *, timeout_s: float | None = None) -> None:
        self.calls.append("ping")

    def wake(self, *, reconcile: bool = False) -> bool:
        self.calls.append("wake")
        return True

    def close(self) -> None:
        self.calls.append("close")


class _EmptyQueue:
    def __init__(self) -> None:
        self.pages = 0
        self.active = 0  # runs dispatching or running, as the budget pre-check counts them

    def active_count(self, task: str | None = None) -> int:
        return self.active

    def dispatch_candidates(self, **_: Any) -> Any:
        self.pages += 1
        return SimpleNamespace(items=[], next_cursor=None)


def _hooks(tmp_path: Path, worker: _Worker, queue: _EmptyQueue) -> Any:
    settings = Settings(data_dir=tmp_path, database_url="sqlite://", profile=EDGE)
    unused = cast(Any, None)
    return build_execution(
        settings, candidates=cast(Any, queue), definitions=unused, secrets=unused,
        transitions=unused, client=cast(Any, worker),
    )  # fmt: skip


def test_the_wake_hook_wakes_the_worker_and_lists_no_candidates(tmp_path: Path) -> None:
    worker, queue = _Worker(), _EmptyQueue()
    _hooks(tmp_path, worker, queue).wake_worker()
    assert worker.calls == ["wake"] and queue.pages == 0


def test_the_drain_hook_lists_candidates_and_never_wakes_the_worker(tmp_path: Path) -> None:
    worker, queue = _Worker(), _EmptyQueue()
    _hooks(tmp_path, worker, queue).drain()
    assert worker.calls == ["ping"] and queue.pages == 1


def test_while_the_running_budget_is_used_up_a_tick_drains_only_once_a_run_ended(
    tmp_path: Path,
) -> None:
    """docs/concurrency-budgets.md §4: the budget poll is one count until the count falls."""
    worker, queue = _Worker(), _EmptyQueue()
    hooks = _hooks(tmp_path, worker, queue)
    queue.active = EDGE.max_running
    hooks.drain()
    assert (worker.calls, queue.pages, hooks.budget_wait()) == (["ping"], 0, True)
    hooks.tick()  # nothing ended: no ping, no page
    assert (worker.calls, queue.pages) == (["ping"], 0)
    queue.active -= 1
    hooks.tick()  # a run ended: a real drain, which finds the queue empty and unblocks
    assert (worker.calls, queue.pages, hooks.budget_wait()) == (["ping", "ping"], 1, False)


def test_the_slow_loop_ticks_at_the_budget_poll_pace_only_while_soon_says_so() -> None:
    """Interval 1 h: without ``soon`` no tick in 0.5 s; with it, several (every 0.02 s)."""
    ticks = threading.Semaphore(0)
    waiting = threading.Event()
    background = Background(
        on_enqueued=None, periodic=ticks.release, interval_s=3600.0,
        soon=waiting.is_set, soon_interval_s=0.02,
    )  # fmt: skip
    background.start()
    try:
        assert not ticks.acquire(timeout=0.5)
        waiting.set()
        background.enqueued()  # the loop re-reads ``soon`` once it wakes
        assert all(ticks.acquire(timeout=5) for _ in range(3))
    finally:
        background.stop()


def test_a_retry_that_comes_due_during_a_pass_gets_the_next_pass_at_once() -> None:
    """docs/retries.md §2: a pass that began before a retry's instant and read the retries
    before it (so it promoted nothing) ends after the instant. The loop must not wait a whole
    interval for that retry: the read that sets the next wake asks for retries due after the
    pass began, and one already due means a pass now."""
    waiting: list[int] = []  # the retry instants not promoted yet (as ms)
    ticks: list[float] = []
    two = threading.Event()

    def periodic() -> None:
        ticks.append(time.monotonic())
        if len(ticks) == 1:  # promotes the due one, reads before the next instant, outlives it
            waiting[:] = [now_ms() + 100]
            time.sleep(0.3)
        else:
            waiting.clear()  # promoted
            two.set()

    def next_due_s(since_ms: int) -> float | None:
        later = [at for at in waiting if at > since_ms]  # what RunReader.next_retry_at_ms does
        return None if not later else max((min(later) - now_ms()) / 1000, 0.0)

    background = Background(
        on_enqueued=None, periodic=periodic, interval_s=3600.0, next_due_s=next_due_s
    )
    waiting.append(1)  # a retry long due at start: the first pass comes at once
    background.start()
    try:
        assert two.wait(5), "the retry that came due during the first pass waited an interval"
        assert ticks[1] - ticks[0] < 1.0 and waiting == []
    finally:
        background.stop()


def test_retry_wake_asks_from_the_pass_start_and_says_zero_for_an_instant_passed() -> None:
    """The real ``retry_wake`` over a stub reader: the read asks for retries later than the
    earlier of the pass's start and now; one already passed is a wake now (0), a later one
    its distance; none waiting is None."""
    asked: list[int] = []
    waiting: list[int] = []

    class Reader:
        def next_retry_at_ms(self, *, after_ms: int) -> int | None:
            asked.append(after_ms)
            later = [at for at in waiting if at > after_ms]
            return min(later) if later else None

    due = retry_wake(cast(RunReader, Reader()))
    now = now_ms()
    assert due(now - 5_000) is None and asked[-1] == now - 5_000  # none waits
    waiting.append(now - 1_000)  # came due during the pass that began 5 s ago
    assert due(now - 5_000) == 0.0
    assert due(now + 60_000) is None and asked[-1] <= now_ms()  # never asks from the future
    waiting[:] = [now + 30_000]
    seconds = due(now)
    assert seconds is not None and 29.0 < seconds <= 30.1


def test_the_slow_loop_wakes_at_the_earliest_retry_and_not_before() -> None:
    """docs/retries.md §2: interval 1 h; the loop sleeps until the next retry is due (read
    again after every wake), and with none waiting it does not tick at all."""
    ticks: list[float] = []
    due: list[float | None] = [None]
    ticked = threading.Event()
    clock = threading.Event()

    def periodic() -> None:
        ticks.append(time.monotonic())
        due[0] = None  # the retry started: nothing else waits
        ticked.set()

    background = Background(
        on_enqueued=None, periodic=periodic, interval_s=3600.0,
        next_due_s=lambda _since: due[0],
    )  # fmt: skip
    background.start()
    try:
        assert not clock.wait(0.3) and ticks == []  # no retry waiting: no tick, no poll
        due[0] = 0.4
        set_at = time.monotonic()
        background.enqueued()  # any wake re-reads the earliest retry
        assert ticked.wait(5)
        assert ticks[0] - set_at >= 0.35  # not before its instant
        assert not clock.wait(0.3) and len(ticks) == 1
    finally:
        background.stop()
