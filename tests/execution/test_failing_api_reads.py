"""The api's reads around its passes on a database that is not migrated: a line when the
failure starts and one when it ends, not one per tick (app/failure_log.py).

Real repositories on a real SQLite file with no tables, as ``qinglong api`` meets it before
``qinglong migrate``: the read that sets the background thread's next wake, and the
promotion of due retries before a drain's passes.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy import Engine

from app.context.bootstrap import Background, retry_wake
from app.context.execution_wiring import DispatchBackoff, build_execution
from app.domain.errors import NotMigrated, WorkerUnavailable
from app.domain.profiles import EDGE
from app.settings import Settings
from app.storage.definitions_repo import DefinitionRepository
from app.storage.migrate import upgrade_to_head
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from tests.execution.kit import MemorySecrets

TICKS = 60


def _lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


def test_the_next_retry_read_failing_every_tick_is_one_line_then_its_recovery(
    unmigrated: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    ticks = 0
    failing_done, migrated, recovered = threading.Event(), threading.Event(), threading.Event()

    def periodic() -> None:  # the pass itself: counts ticks, holds the loop while migrating
        nonlocal ticks
        ticks += 1
        if ticks == TICKS:
            failing_done.set()
            assert migrated.wait(20)
        elif ticks > TICKS + 1:
            recovered.set()

    background = Background(
        on_enqueued=None, periodic=periodic, interval_s=0.001,
        next_due_s=retry_wake(RunReader(unmigrated)),
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="qinglong.context"):
        background.start()
        try:
            assert failing_done.wait(20)
            failing = _lines(caplog, "qinglong.context")
            upgrade_to_head(unmigrated)
            migrated.set()
            assert recovered.wait(20)
        finally:
            background.stop()
    # A read before each of the 60 ticks, each refused: one line, not 60.
    assert failing == ["next retry read failed: NotMigrated"]
    assert _lines(caplog, "qinglong.context")[1:] == [f"next retry read works again after {TICKS} failure(s)"]


class _AnsweringWorker:
    """The worker's socket answering every ping (an older worker: no instance id), so each
    drain goes on to promote due retries; the database is what fails."""

    def ping(self, *, timeout_s: float | None = None) -> None:
        return None

    def close(self) -> None:
        return None


def test_promoting_due_retries_failing_every_drain_is_one_line_then_its_recovery(
    unmigrated: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runs = RunRepository(unmigrated)
    hooks = build_execution(
        Settings(data_dir=tmp_path / "data", database_url="sqlite://", profile=EDGE),
        candidates=RunReader(unmigrated), definitions=DefinitionRepository(unmigrated),
        secrets=MemorySecrets(), transitions=runs, client=cast(Any, _AnsweringWorker()),
        promote_due=lambda limit: runs.promote_due_retries(limit=limit),
    )  # fmt: skip
    try:
        with caplog.at_level(logging.INFO, logger="qinglong.dispatch"):
            for _ in range(TICKS):
                with pytest.raises(NotMigrated):  # the pass fails too (the Background logs it)
                    hooks.drain()
            failing = _lines(caplog, "qinglong.dispatch")
            upgrade_to_head(unmigrated)
            hooks.drain()
    finally:
        hooks.close()
    assert failing == ["promoting due retries failed: NotMigrated"]  # 60 drains, one line
    assert _lines(caplog, "qinglong.dispatch")[1:] == [f"promoting due retries works again after {TICKS} failure(s)"]


class _SwitchingWorker:
    """A worker socket that answers until ``away`` is set, then refuses (a worker that
    stopped serving, as one does once the database stays away past its lease)."""

    def __init__(self) -> None:
        self.away = threading.Event()

    def ping(self, *, timeout_s: float | None = None) -> None:
        if self.away.is_set():
            raise WorkerUnavailable("worker socket not answering")
        return None

    def close(self) -> None:
        return None


def test_a_drain_skipped_for_want_of_a_worker_is_no_recovery_of_the_failing_database(
    unmigrated: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: during a PostgreSQL outage the worker stopped serving, the drain then returned
    # before any read, and the log said `background pass (periodic) works again after 9
    # failure(s)` while the database was still away.
    runs = RunRepository(unmigrated)
    worker = _SwitchingWorker()
    hooks = build_execution(
        Settings(data_dir=tmp_path / "data", database_url="sqlite://", profile=EDGE),
        candidates=RunReader(unmigrated), definitions=DefinitionRepository(unmigrated),
        secrets=MemorySecrets(), transitions=runs, client=cast(Any, worker),
        backoff=DispatchBackoff(base_s=0.0, cap_s=0.0),
    )  # fmt: skip
    ticks = 0
    skipped, migrated, recovered = threading.Event(), threading.Event(), threading.Event()

    def periodic() -> bool:
        nonlocal ticks
        ticks += 1
        if ticks == 5:
            worker.away.set()  # the database still away: these drains read nothing
        elif ticks == 15:
            skipped.set()
            assert migrated.wait(20)
        elif ticks > 16:
            recovered.set()
        return hooks.tick()

    background = Background(on_enqueued=None, periodic=periodic, interval_s=0.001)
    try:
        with caplog.at_level(logging.INFO, logger="qinglong.context"):
            background.start()
            assert skipped.wait(20)
            during = _lines(caplog, "qinglong.context")
            upgrade_to_head(unmigrated)
            worker.away.clear()
            migrated.set()
            assert recovered.wait(20)
    finally:
        background.stop()
        hooks.close()
    assert during == ["background pass (periodic) failed: NotMigrated"]
    assert _lines(caplog, "qinglong.context")[1:] == [
        "background pass (periodic) works again after 4 failure(s)"
    ]
