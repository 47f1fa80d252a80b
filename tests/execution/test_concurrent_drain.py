"""The api's drain runs several passes side by side over one shared dispatcher."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.context.execution_wiring import _drain_concurrently, drain_concurrency
from app.domain.execution import LaunchRequest
from app.domain.model import ProcessHandle
from app.execution.dispatcher import CandidateOutcome, PassResult
from app.storage.run_reads import RunReader
from tests.execution.kit import FakeLauncher, define, enqueue, fake_handle, make_kit

RUNS = 24


def test_concurrency_follows_the_profile_page_size() -> None:
    assert drain_concurrency(4) == 1  # edge: one pass at a time
    assert drain_concurrency(16) == 4  # standalone
    assert drain_concurrency(1) == 1


def test_concurrent_drain_launches_each_attempt_exactly_once(
    engine: Engine, tmp_path: Path
) -> None:
    define(engine)
    run_ids = [enqueue(engine).id for _ in range(RUNS)]
    launcher = FakeLauncher(engine)
    kit = make_kit(engine, tmp_path / "logs", launcher=launcher)
    _drain_concurrently(kit.dispatcher, 4, threading.Event())
    assert not [t for t in threading.enumerate() if t.name == "ql-drain"]
    reader = RunReader(engine)
    attempts = []
    for run_id in run_ids:
        run = reader.get_run(run_id)
        assert run.status == "running"
        assert run.latest_attempt is not None
        attempts.append(run.latest_attempt.id)
    counts = Counter(o.request.attempt_id for o in launcher.observed)
    assert sorted(counts) == sorted(attempts)
    assert set(counts.values()) == {1}


class _Exploding:
    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def run_pass(self) -> PassResult:
        with self.lock:
            self.calls += 1
            first = self.calls == 1
        if threading.current_thread().name == "ql-drain":
            raise RuntimeError("boom")
        if first:  # an activation with more in its page, so the drain fans out
            started = CandidateOutcome(run_id="r", attempt_id="a", kind="started")
            return PassResult(outcomes=(started,), truncated=False, more_in_page=True)
        return PassResult(outcomes=(), truncated=False)


def test_a_failing_helper_is_logged_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    fake = _Exploding()
    with caplog.at_level(logging.ERROR, logger="qinglong.dispatch"):
        _drain_concurrently(fake, 3, threading.Event())  # type: ignore[arg-type]
    assert fake.calls == 4  # the first pass, two failing helpers, and this thread's last pass
    # Two helpers failing the same way: one line (app/failure_log.py).
    assert caplog.text.count("background pass (drain helper) failed: RuntimeError") == 1


@pytest.mark.parametrize("drainers", [1, 4])
def test_an_idle_tick_runs_one_pass_and_starts_no_thread(drainers: int) -> None:
    fake = _Exploding()
    fake.calls = 1  # the next pass finds nothing to activate
    before = threading.active_count()
    _drain_concurrently(fake, drainers, threading.Event())  # type: ignore[arg-type]
    assert fake.calls == 2  # one pass, for the edge profile's single drainer too
    assert threading.active_count() == before


def test_a_launch_from_a_page_of_one_ends_the_drain_without_helpers(
    engine: Engine, tmp_path: Path
) -> None:
    # One run posted to an idle service: the pass that launched it saw nothing else, so no
    # helper starts and no last pass reads the queue again (a count and a page each).
    define(engine)
    only = enqueue(engine)
    launcher = FakeLauncher(engine)
    kit = make_kit(engine, tmp_path / "logs", launcher=launcher)
    passes: list[PassResult] = []
    run_pass = kit.dispatcher.run_pass

    def counted() -> PassResult:
        result = run_pass()
        passes.append(result)
        return result

    kit.dispatcher.run_pass = counted  # type: ignore[method-assign]
    before = threading.active_count()
    _drain_concurrently(kit.dispatcher, 4, threading.Event())
    assert threading.active_count() == before
    assert len(passes) == 1 and not passes[0].more_in_page
    assert passes[0].activated is not None and passes[0].activated.run_id == only.id
    assert RunReader(engine).get_run(only.id).status == "running"


def test_a_launch_from_a_page_with_more_fans_out_and_starts_them_all(
    engine: Engine, tmp_path: Path
) -> None:
    define(engine)
    run_ids = [enqueue(engine).id for _ in range(3)]
    kit = make_kit(engine, tmp_path / "logs", launcher=FakeLauncher(engine))
    first = kit.dispatcher.run_pass()
    assert first.activated is not None and first.more_in_page  # two more stood behind it
    _drain_concurrently(kit.dispatcher, 4, threading.Event())
    reader = RunReader(engine)
    assert [reader.get_run(r).status for r in run_ids] == ["running"] * 3


def test_an_overlapping_pass_skips_the_candidate_another_pass_has_in_hand(
    engine: Engine, tmp_path: Path
) -> None:
    define(engine)
    first, second = enqueue(engine), enqueue(engine)
    entered, release = threading.Event(), threading.Event()

    def slow_launch(request: LaunchRequest) -> ProcessHandle:
        if request.run_id == first.id:
            entered.set()
            assert release.wait(10)
        return fake_handle()

    kit = make_kit(engine, tmp_path / "logs", launcher=FakeLauncher(engine, handle=slow_launch))
    results: list[PassResult] = []
    holder = threading.Thread(target=lambda: results.append(kit.dispatcher.run_pass()))
    holder.start()
    try:
        assert entered.wait(10)
        overlapping = kit.dispatcher.run_pass()
    finally:
        release.set()
        holder.join(10)
    # The first candidate was never touched by the overlapping pass: it went on to the next.
    assert [o.run_id for o in overlapping.outcomes] == [second.id]
    assert overlapping.activated is not None and overlapping.activated.kind == "started"
    assert results[0].activated is not None and results[0].activated.run_id == first.id


@pytest.mark.parametrize("drainers", [1, 4])
def test_a_halt_lets_the_launch_in_flight_finish_and_starts_no_further_pass(
    engine: Engine, tmp_path: Path, drainers: int
) -> None:
    define(engine)
    run_ids = [enqueue(engine).id for _ in range(RUNS)]
    halted = threading.Event()

    def launch_then_halt(request: LaunchRequest) -> ProcessHandle:
        halted.set()  # shutdown begins while this launch is in flight
        return fake_handle()

    launcher = FakeLauncher(engine, handle=launch_then_halt)
    kit = make_kit(engine, tmp_path / "logs", launcher=launcher)
    _drain_concurrently(kit.dispatcher, drainers, halted)
    reader = RunReader(engine)
    statuses = Counter(reader.get_run(run_id).status for run_id in run_ids)
    assert statuses == {"running": 1, "queued": RUNS - 1}
    assert launcher.calls == 1
