"""Concurrency budgets in dispatch admission (docs/concurrency-budgets.md §2, docs/design.md §3.3)."""

from __future__ import annotations

import contextlib
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from app.domain.errors import ErrorCode
from app.domain.execution import LaunchRequest
from app.domain.model import ProcessHandle
from app.storage.definitions_repo import DefinitionRepository
from app.storage.engine import make_engine
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from tests.execution.kit import FakeLauncher, define, enqueue, fake_handle, files_under, make_kit

ROOT = Path(__file__).resolve().parents[2]


def _end(engine: Engine, run_id: str) -> None:
    """End a started run (as its job's ending would): it no longer counts against a budget."""
    run = RunReader(engine).get_run(run_id)
    assert run.latest_attempt is not None
    RunRepository(engine).fail_attempt(
        run_id=run_id, attempt_id=run.latest_attempt.id, error_code=ErrorCode.EXECUTOR_START_FAILED
    )


class LyingCounts:
    """The real candidate source, except that its pre-check counts always say "room"."""

    def __init__(self, engine: Engine) -> None:
        self._reader = RunReader(engine)

    def dispatch_candidates(self, **kwargs: Any) -> Any:
        return self._reader.dispatch_candidates(**kwargs)

    def get_run(self, run_id: str) -> Any:
        return self._reader.get_run(run_id)

    def active_count(self, task: str | None = None) -> int:
        return 0


def test_a_pass_at_the_global_cap_reads_no_page_and_the_run_starts_once_one_ends(
    engine: Engine, tmp_path: Path
) -> None:
    """With max_running 2 the third run stays queued, untouched, until a started one ends."""
    define(engine)
    runs = [enqueue(engine) for _ in range(3)]
    kit = make_kit(engine, tmp_path / "logs", max_running=2)
    assert [o.kind for o in kit.dispatcher.run_pass().outcomes] == ["started"]
    assert [o.kind for o in kit.dispatcher.run_pass().outcomes] == ["started"]

    blocked = kit.dispatcher.run_pass()
    assert blocked.at_capacity and blocked.budget_blocked
    assert blocked.outcomes == () and blocked.activated is None
    waiting = kit.run(runs[2].id)
    assert (waiting.status, waiting.version) == ("queued", 1)  # no event per blocked pass
    assert kit.launcher.calls == 2

    _end(engine, runs[0].id)
    assert [o.kind for o in kit.dispatcher.run_pass().outcomes] == ["started"]
    assert kit.run(runs[2].id).status == "running"


def test_t1_refuses_a_start_beyond_the_global_cap_when_the_pre_check_was_stale(
    engine: Engine, tmp_path: Path
) -> None:
    """The pre-check said "room"; T1 counts again under its lock, refuses, and no log stays."""
    define(engine)
    first, second = enqueue(engine), enqueue(engine)
    kit = make_kit(engine, tmp_path / "logs", max_running=1)
    kit.dispatcher._candidates = LyingCounts(engine)
    kit.dispatcher.run_pass()
    kit.dispatcher._materializer._candidates = LyingCounts(engine)

    result = kit.dispatcher.run_pass()
    assert [o.kind for o in result.outcomes] == ["at_capacity"]
    assert result.at_capacity and result.activated is None
    assert kit.run(first.id).status == "running"
    refused = kit.run(second.id)
    assert (refused.status, refused.version) == ("queued", 1)
    assert refused.latest_attempt is not None and refused.latest_attempt.status == "claimed"
    assert len(files_under(kit.logs_dir)) == 1  # only the started run's log
    assert kit.launcher.calls == 1


def test_a_task_at_its_max_concurrent_is_skipped_and_the_rest_of_the_page_starts(
    engine: Engine, tmp_path: Path
) -> None:
    """A capped task's waiting runs never hold back another task's run behind them."""
    define(engine, "capped", max_concurrent=1)
    define(engine, "free")
    capped = [enqueue(engine, "capped") for _ in range(3)]
    free = enqueue(engine, "free")
    kit = make_kit(engine, tmp_path / "logs")
    assert [o.kind for o in kit.dispatcher.run_pass().outcomes] == ["started"]

    result = kit.dispatcher.run_pass()
    # The second capped run is examined once; the third is passed over without a query.
    assert [(o.run_id, o.kind) for o in result.outcomes] == [
        (capped[1].id, "task_at_capacity"),
        (free.id, "started"),
    ]
    assert result.budget_blocked and not result.at_capacity
    assert kit.run(free.id).status == "running"
    for run in capped[1:]:
        waiting = kit.run(run.id)
        assert (waiting.status, waiting.version) == ("queued", 1)

    _end(engine, capped[0].id)
    assert [o.kind for o in kit.dispatcher.run_pass().outcomes] == ["started"]
    assert kit.run(capped[1].id).status == "running"
    assert kit.run(capped[2].id).status == "queued"


def test_t1_refuses_a_task_start_beyond_its_max_concurrent_and_the_pass_goes_on(
    engine: Engine, tmp_path: Path
) -> None:
    """A stale task pre-check: T1 refuses the capped run, the next candidate still starts."""
    define(engine, "capped", max_concurrent=1)
    define(engine, "free")
    first = enqueue(engine, "capped")
    second = enqueue(engine, "capped")
    free = enqueue(engine, "free")
    kit = make_kit(engine, tmp_path / "logs")
    kit.dispatcher.run_pass()
    kit.dispatcher._materializer._candidates = LyingCounts(engine)

    result = kit.dispatcher.run_pass()
    assert [(o.run_id, o.kind) for o in result.outcomes] == [
        (second.id, "task_at_capacity"),
        (free.id, "started"),
    ]
    assert kit.run(first.id).status == "running"
    assert kit.run(second.id).status == "queued"
    assert len(files_under(kit.logs_dir)) == 2  # the refused start's log was removed


def test_a_revision_without_max_concurrent_keeps_its_digest_and_body(engine: Engine) -> None:
    """The field enters the revision body only when set: older digests are unchanged."""
    plain = define(engine, "plain")
    capped = define(engine, "capped", max_concurrent=3)
    assert "max_concurrent" not in plain.body()
    assert capped.body()["max_concurrent"] == 3
    stored = DefinitionRepository(engine).get_revision("capped", 1)
    assert stored.max_concurrent == 3 and stored.digest == capped.digest
    assert plain.digest != capped.digest


CAP = 3
RUNS = 30
THREADS = 4


class CountingLauncher(FakeLauncher):
    """Counts the database's active runs at each launch (T1 committed, so it is one of them)."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self.seen: list[int] = []

    def launch(self, request: LaunchRequest) -> ProcessHandle:
        self.seen.append(RunReader(self._engine).active_count())
        return fake_handle()


def test_concurrent_dispatchers_with_their_own_connections_never_exceed_the_global_cap(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    """Four dispatchers (own engines) race while runs keep ending; a sampler never sees more
    than QL_MAX_RUNNING active, and every run starts once."""
    define(engine)
    run_ids = [enqueue(engine).id for _ in range(RUNS)]
    launcher = CountingLauncher(engine)
    engines = [make_engine(db_url) for _ in range(THREADS + 1)]
    stop = threading.Event()
    errors: list[BaseException] = []
    peak = [0]

    def dispatch(own: Engine) -> None:
        try:
            kit = make_kit(own, tmp_path / "logs", launcher=launcher, max_running=CAP)
            deadline = time.monotonic() + 90
            while not stop.is_set() and time.monotonic() < deadline:
                result = kit.dispatcher.run_pass()
                assert all(o.kind != "error" for o in result.outcomes), result
                if result.activated is None:
                    time.sleep(0.002)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def finish(own: Engine) -> None:
        reader, rng = RunReader(own), random.Random(7)
        try:
            while not stop.is_set():
                active = reader.active_count()
                peak[0] = max(peak[0], active)
                running = reader.list_runs(task=None, status="running", limit=50, cursor=None).items
                if running:
                    time.sleep(rng.random() * 0.01)
                    # A lost race (the run ended meanwhile) is fine: another is tried next round.
                    with contextlib.suppress(Exception):
                        _end(own, rng.choice(running).id)
                done = reader.list_runs(task=None, status="failed", limit=50, cursor=None)
                if len(done.items) == RUNS:
                    stop.set()
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=dispatch, args=(e,)) for e in engines[:THREADS]]
    threads.append(threading.Thread(target=finish, args=(engines[THREADS],)))
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
    finally:
        stop.set()
        for own in engines:
            own.dispose()
    assert errors == []
    assert len(launcher.seen) == RUNS  # each run started exactly once
    assert max(launcher.seen) <= CAP and peak[0] <= CAP
    assert max(launcher.seen) == CAP  # the budget was reached, so the bound was tested
    reader = RunReader(engine)
    assert {reader.get_run(r).status for r in run_ids} == {"failed"}


@pytest.mark.slow
def test_dispatcher_processes_racing_for_the_last_slots_admit_exactly_the_cap(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    """Four OS processes (as api workers are) start passes at once: exactly 5 of 24 start."""
    define(engine)
    for _ in range(24):
        enqueue(engine)
    launch_log = tmp_path / "launches.txt"
    argv = [sys.executable, "-m", "tests.execution.pass_worker", db_url]
    argv += [str(tmp_path / "logs"), str(launch_log), "5"]
    procs = [subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.PIPE) for _ in range(4)]
    try:
        outputs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
    assert [p.returncode for p in procs] == [0] * 4, outputs
    assert len(launch_log.read_text().split()) == 5
    reader = RunReader(engine)
    assert reader.active_count() == 5
    assert len(reader.list_runs(task=None, status="queued", limit=50, cursor=None).items) == 19
