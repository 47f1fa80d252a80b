"""The worker's loops on a database that is not migrated: a line when the failure starts and
one when it ends, not a line per pass (app/failure_log.py, docs/operations.md §5).

Real repositories on a real SQLite file with no tables: every statement is refused with
NotMigrated, as a worker started before ``qinglong migrate`` meets it. The lease gate
(``may_run``) counts the loops' turns and closes while the test migrates, so no pass races
the migration.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from app.domain.errors import NotMigrated
from app.domain.ids import now_ms
from app.domain.profiles import EDGE
from app.domain.retention import GlobalBudgets, RetentionPolicy
from app.execution.cancellation import CancellationSweep
from app.execution.recovery_loop import RecoveryLoop
from app.storage.migrate import upgrade_to_head
from app.storage.retention_repo import RetentionRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.storage.tables import receipt_journal
from app.worker.launcher import IdentityController
from app.worker.log_retention import LogSweep, RetentionLoop
from app.worker.receipts import ReceiptStore
from tests.recovery.kit import in_process_reconciler
from tests.worker.kit import armed_run

TURNS = 60  # failed turns of a loop, each a pass (two in the recovery loop)


class Gate:
    """The loop's lease gate: open for ``turns`` turns, then closed until reopened."""

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.count = 0
        self.closed = threading.Event()
        self.reopened = threading.Event()

    def __call__(self) -> bool:
        if self.count >= self.turns and not self.reopened.is_set():
            self.closed.set()
            return False
        self.count += 1
        return True


def _until(done: threading.Event | None = None, check: object = None) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if (done is not None and done.is_set()) or (callable(check) and check()):
            return
        time.sleep(0.005)
    raise AssertionError("the loop did not get there in 20 s")


def _lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


def _fail_then_migrate(
    loop: RecoveryLoop | RetentionLoop, gate: Gate, engine: Engine,
    caplog: pytest.LogCaptureFixture, logger: str, passes: int,
) -> list[str]:
    """Run ``loop`` on the unmigrated database until its gate closes, migrate, let it pass
    ``passes`` times; the lines ``logger`` wrote while it failed (the rest stay in caplog)."""
    with caplog.at_level(logging.INFO, logger=logger):
        loop.start()
        try:
            _until(gate.closed)
            failing = _lines(caplog, logger)
            upgrade_to_head(engine)
            gate.reopened.set()
            _until(check=lambda: loop.passes >= passes)
        finally:
            loop.stop(timeout=10)
    return failing


def test_a_recovery_loop_failing_every_pass_logs_each_kind_once_then_its_recovery(
    unmigrated: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = unmigrated
    gate = Gate(TURNS)
    loop = RecoveryLoop(
        reconciler=in_process_reconciler(engine, ReceiptStore(tmp_path / "receipts"), [now_ms()]),
        cancellation=CancellationSweep(
            attempts=RunReader(engine), intents=RunRepository(engine),
            controller=IdentityController(), profile=EDGE,
        ),
        interval_s=0.0,  # a reconcile pass every turn, then a sweep
        sweep_interval_s=0.001,
        may_run=gate,
    )  # fmt: skip
    # A pass, its sweep, another pass once migrated.
    failing = _fail_then_migrate(loop, gate, engine, caplog, "app.execution.recovery_loop", 2)
    # 60 turns, 120 failed passes: one line per kind, not 120.
    assert failing == ["reconcile pass failed: NotMigrated", "cancellation pass failed: NotMigrated"]
    assert _lines(caplog, "app.execution.recovery_loop")[2:] == [
        f"reconcile pass works again after {TURNS} failure(s)",
        f"cancellation pass works again after {TURNS} failure(s)",
    ]


def test_a_retention_loop_failing_every_pass_logs_once_then_its_recovery(
    unmigrated: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gate = Gate(TURNS)
    sweep = LogSweep(
        repo=RetentionRepository(unmigrated),
        logs_root=tmp_path / "logs",
        policy=RetentionPolicy(keep_runs=10, keep_days=0, keep_rows=20, task_log_bytes=None),
        budgets=GlobalBudgets(total_log_bytes=None, free_reserve_bytes=0),
        tasks_per_pass=10,
        files_per_pass=100,
    )
    loop = RetentionLoop(sweep, interval_s=0.0, min_gap_s=0.001, may_run=gate)
    failing = _fail_then_migrate(loop, gate, unmigrated, caplog, "app.worker.log_retention", 1)
    assert failing == ["retention pass failed: NotMigrated"]  # 60 failed passes, one line
    assert _lines(caplog, "app.worker.log_retention")[1:] == [
        f"retention pass works again after {TURNS} failure(s)"
    ]


def test_attempts_that_fail_every_reconcile_pass_are_one_line_not_one_each_a_pass(
    unmigrated: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = unmigrated
    upgrade_to_head(engine)
    for _ in range(3):
        armed_run(engine)  # starting: each pass reads its journal entry
    with engine.begin() as conn:  # a restore that lost one table: every entry read fails
        conn.execute(text(f"DROP TABLE {receipt_journal.name}"))
    rec = in_process_reconciler(engine, ReceiptStore(tmp_path / "receipts"), [now_ms()])
    with caplog.at_level(logging.INFO, logger="app.execution.reconciler"):
        for _ in range(20):
            with pytest.raises(NotMigrated):  # the journal sweep after them fails the pass
                rec.run_pass()
        failing = _lines(caplog, "app.execution.reconciler")
        receipt_journal.create(engine)
        assert rec.run_pass().examined == 3
    assert failing == ["reconcile of an attempt failed: NotMigrated"]  # 20 passes x 3 attempts
    assert _lines(caplog, "app.execution.reconciler")[1:] == [
        "reconcile of an attempt works again after 60 failure(s)"
    ]


def test_a_pass_that_did_not_reach_the_failing_attempt_does_not_say_it_works_again(
    unmigrated: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Seventeen active attempts, 16 a pass on the edge profile: passes alternate between
    # reaching the failing one and not. "works again" after a pass that did not reach it
    # hid a failure that never went away; it waits for a whole round with none failing.
    engine = unmigrated
    upgrade_to_head(engine)
    for _ in range(17):
        armed_run(engine)
    rec = in_process_reconciler(engine, ReceiptStore(tmp_path / "receipts"), [now_ms()])
    real_one, broken = rec._one, RunReader(engine).active_attempts(limit=1, after_id=None)
    failing = {broken[0].attempt_id}

    def one(attempt: object, report: object) -> None:
        if getattr(attempt, "attempt_id", None) in failing:
            raise RuntimeError("this attempt's entry cannot be read")
        real_one(attempt, report)  # type: ignore[arg-type]

    monkeypatch.setattr(rec, "_one", one)
    with caplog.at_level(logging.INFO, logger="app.execution.reconciler"):
        for _ in range(6):
            rec.run_pass()
        assert _lines(caplog, "app.execution.reconciler") == [
            "reconcile of an attempt failed: RuntimeError"
        ]
        failing.clear()
        for _ in range(2):  # the round that reaches it, then one whole round without
            rec.run_pass()
    assert _lines(caplog, "app.execution.reconciler")[1:] == [
        "reconcile of an attempt works again after 3 failure(s)"
    ]
