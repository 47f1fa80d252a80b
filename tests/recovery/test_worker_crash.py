"""kill -9 of the worker around real jobs: every ending is recorded once, from the receipt.

Crash points are named and injected, never waited for: the worker is SIGKILLed by pid at a
known moment (jobs gated on files the test creates), or the completion runs with a journal
that raises right after the terminal commit. Every wait is a bounded poll of a real state.
"""

from __future__ import annotations

import json

from app.domain.ids import now_ms
from app.domain.profiles import EDGE
from app.domain.receipt import decode_receipt
from app.execution.completion import CompletionService
from app.storage.journal_repo import CONSUMED, QUARANTINED, JournalRepository
from app.worker.identity import wait_exit
from app.worker.log_facts import LogFacts
from tests.recovery.kit import (
    DEADLINE,
    Rig,
    gated,
    in_process_reconciler,
    terminal_events,
    wait_for,
)
from tests.worker.kit import CrashAfterCommit


def test_kill9_worker_while_five_jobs_run_every_ending_is_recorded_once(rig: Rig) -> None:
    rig.worker.start()
    codes = [0, 3, 4, 5, 6]
    # Jobs 0-2 outlive the worker's downtime; jobs 3-4 finish while it is down, so their
    # receipts are published and wait for a worker that is not there (crash before the
    # terminal transaction).
    armed, handles = [], []
    for i, code in enumerate(codes):
        a = rig.arm()
        gates = ("g1", "g2") if i < 3 else ("g1",)
        handles.append(rig.launch(a, gated(*gates, then=f"exit {code}", tag=f"-{i}")))
        armed.append(a)
    wait_for(lambda: all(b"start" in rig.log_bytes(a) for a in armed), "every job to print")
    rig.kill_worker()
    rig.gate("g1").touch()  # output after the kill
    for h in handles[3:]:
        assert wait_exit(h.shim_pid, DEADLINE)
    for a in armed[3:]:
        assert rig.store.path_of(a.attempt_id).exists()  # receipt waits for a worker
        assert rig.run(a).status == "running"
    for i, a in enumerate(armed):
        wait_for(lambda a=a, i=i: f"past-g1-{i}".encode() in rig.log_bytes(a), "post-kill output")
    rig.worker.start()
    rig.gate("g2").touch()
    for i, (a, code) in enumerate(zip(armed, codes, strict=True)):
        run = rig.wait_status(a)
        status = "succeeded" if code == 0 else "failed"
        assert run.latest_attempt is not None
        assert (run.status, run.latest_attempt.exit_code) == (status, code)
        assert terminal_events(rig.engine, a.run_id) == [f"attempt.{status}", f"run.{status}"]
        assert f"past-g1-{i}".encode() in rig.log_bytes(a)
        wait_for(lambda a=a: _state(rig.journal, a.attempt_id) == CONSUMED, "consumed")
        assert not rig.store.path_of(a.attempt_id).exists()
    # The start-up says what it found, in counts: the two that ended while it was down, the
    # three that still ran.
    assert (
        "start-up: 5 job(s) launched before this start: 2 ended meanwhile, recorded now from "
        "their receipts; 3 still running (watched)\n"
    ) in rig.worker.stderr()


def test_crash_after_the_transaction_before_cleanup_records_nothing_twice(rig: Rig) -> None:
    a = rig.ended_while_down("exit 7")
    dying = CompletionService(
        receipts=CrashAfterCommit(rig.store), journal=rig.journal, completions=rig.runs,
        log_facts=LogFacts(rig.data_dir / "logs"),
    )
    try:
        dying.consume(run_id=a.run_id, attempt_id=a.attempt_id)
        raise AssertionError("the injected crash did not happen")
    except RuntimeError:
        pass
    # The ending and the journal's consumed mark are one commit: nothing is pending.
    assert rig.run(a).status == "failed" and rig.store.path_of(a.attempt_id).exists()
    assert _state(rig.journal, a.attempt_id) == CONSUMED
    rig.worker.start()  # a restart finds nothing to replay
    assert rig.run(a).status == "failed"
    assert _state(rig.journal, a.attempt_id) == CONSUMED
    assert terminal_events(rig.engine, a.run_id) == ["attempt.failed", "run.failed"]
    # Retention removes the left-behind file with the row (test_retention.py, in-process).
    clock = [now_ms() + int(EDGE.consumed_receipt_retention_s * 1000) + 1]
    in_process_reconciler(rig.engine, rig.store, clock).purge_retention()
    assert not rig.store.path_of(a.attempt_id).exists()
    assert rig.journal.get(a.attempt_id) is None


def test_bad_receipt_found_after_restart_is_quarantined_and_the_run_is_lost(rig: Rig) -> None:
    a = rig.ended_while_down("exit 0")
    path = rig.store.path_of(a.attempt_id)
    good = json.loads(path.read_bytes())
    assert decode_receipt(path.read_bytes()).exit_code == 0
    path.write_text(json.dumps(good | {"token": "A" * 43}))  # a forged success
    rig.worker.start()
    run = rig.wait_status(a)
    assert run.latest_attempt is not None
    assert (run.status, run.latest_attempt.error_code) == (
        "lost", "RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT"
    )
    assert _state(rig.journal, a.attempt_id) == QUARANTINED
    assert not path.exists()
    assert terminal_events(rig.engine, a.run_id) == ["attempt.lost", "run.lost"]


def _state(journal: JournalRepository, attempt_id: str) -> str | None:
    entry = journal.get(attempt_id)
    return None if entry is None else entry.state
