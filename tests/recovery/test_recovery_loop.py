"""The reconciler's bounds and the loop's lifecycle: resume cursor, no overlap, clean stop."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.domain.ids import now_ms
from app.domain.profiles import EDGE
from app.execution.cancellation import CancellationSweep
from app.execution.recovery_loop import RecoveryLoop
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.worker.launcher import IdentityController
from app.worker.receipts import ReceiptStore
from tests.recovery.kit import in_process_reconciler
from tests.worker.kit import (
    armed_run,
    dead_handle,
    running_run,
    terminal_events,
    wait_for,
    write_receipt,
)


def test_a_pass_is_bounded_and_the_next_resumes_where_it_stopped(
    engine: Engine, tmp_path: Path
) -> None:
    before = now_ms()  # the reconciler's clock stands before every start: each one is young
    for _ in range(20):
        armed_run(engine)  # starting, never launched, young: each is examined and kept
    store = ReceiptStore(tmp_path / "receipts")
    rec = in_process_reconciler(engine, store, [before])
    budget = EDGE.reconcile_pages * EDGE.reconcile_page_size
    assert [rec.run_pass().examined for _ in range(3)] == [budget, 20 - budget, budget]


class _Probe:
    """Stands in for the reconciler and the sweep: records overlap; passes take a while."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.max_running = 0
        self.passes = 0
        self.sweeps = 0
        self.closed = False

    def _enter(self) -> None:
        with self.lock:
            self.running += 1
            self.max_running = max(self.max_running, self.running)

    def _leave(self) -> None:
        with self.lock:
            self.running -= 1

    def run_pass(self) -> object:
        self._enter()
        time.sleep(0.02)  # a pass that takes time, so wakes arrive while it runs
        self.passes += 1
        self._leave()
        return type("R", (), {"lost": 0, "failed": 0, "requeued": 0, "stopped": 0,
                              "undecided": 0, "purged": 0, "purged_consumed": 0,
                              "examined": 0, "completed": 0})()  # fmt: skip

    def run_once(self) -> int:
        self._enter()
        self.sweeps += 1
        self._leave()
        return 0

    def close(self, timeout: float) -> None:
        self.closed = True


def test_wakes_never_overlap_passes_and_stop_is_clean() -> None:
    probe = _Probe()
    loop = RecoveryLoop(
        reconciler=probe,  # type: ignore[arg-type]
        cancellation=probe,  # type: ignore[arg-type]
        interval_s=3600.0,
        sweep_interval_s=3600.0,
    )
    loop.start()
    deadline = time.monotonic() + 10
    while probe.passes < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert probe.passes == 1  # the start-up pass
    for _ in range(50):
        loop.wake(reconcile=True)
    # The woken pass, then its sweep: a stop that came between them would skip the sweep (the
    # loop checks for a stop after each pass), so wait for both before stopping.
    while (probe.passes < 2 or probe.sweeps < 2) and time.monotonic() < deadline:
        time.sleep(0.005)
    loop.stop(timeout=10)
    assert probe.max_running == 1 and probe.closed
    assert 2 <= probe.passes <= 51 and probe.sweeps >= 2
    passes = probe.passes
    loop.wake(reconcile=True)  # after stop (the thread was joined): nothing runs any more
    assert probe.passes == passes


def test_routine_purges_of_consumed_receipts_write_no_line_but_a_loss_does(
    engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Before: every job that ended wrote `reconcile pass: examined 0 completed 0 lost 0 ...
    # purged 1` a retention window later (its consumed receipt's journal row deleted), so a
    # schedule firing every minute wrote a line a minute for good, burying the lines that mean
    # something (a run lost, failed, requeued).
    store = ReceiptStore(tmp_path / "receipts")
    clock = [now_ms()]
    armed, started = running_run(engine, dead_handle())
    write_receipt(store, armed, started)
    loop = RecoveryLoop(
        reconciler=in_process_reconciler(engine, store, clock),
        cancellation=CancellationSweep(
            attempts=RunReader(engine), intents=RunRepository(engine),
            controller=IdentityController(), profile=EDGE,
        ),
        interval_s=3600.0, sweep_interval_s=3600.0,
    )  # fmt: skip

    def one_pass() -> None:
        passes = loop.passes
        loop.wake(reconcile=True)
        wait_for(lambda: loop.passes > passes, "a reconcile pass")

    with caplog.at_level(logging.INFO, logger="app.execution.recovery_loop"):
        loop.start()
        try:
            wait_for(lambda: loop.passes >= 1, "the start-up pass")  # completes the run
            assert terminal_events(engine, armed.run_id)[-1] == "run.succeeded"
            clock[0] += int(EDGE.consumed_receipt_retention_s * 1000) + 60_000
            one_pass()  # purges its consumed journal row: routine
            routine = [r.getMessage() for r in caplog.records]
            lost, _ = running_run(engine, dead_handle())  # a job gone without a receipt
            clock[0] += 3_600_000  # past every grace
            one_pass()
        finally:
            loop.stop(timeout=10)
    assert routine == []
    assert terminal_events(engine, lost.run_id)[-1] == "run.lost"
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("reconcile pass: examined 1 completed 0 lost 1 failed 0 ")
