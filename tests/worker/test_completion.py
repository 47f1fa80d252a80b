"""The completion service against a real repository, journal and receipt files.

Crash windows are injected at named points: inside the terminal transaction (an event
insert or the journal's consumed step raises, so the transaction rolls back) and between
commit and cleanup (the file is left). Either way, exactly one terminal event.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

import app.storage.runs_repo as runs_repo_module
from app.domain.artifacts import log_relpath, quarantine_relpath, receipt_relpath
from app.domain.ids import now_ms, uuid7
from app.domain.model import LogInfo, ProcessHandle
from app.domain.receipt import Receipt, encode_receipt
from app.domain.retry import RetryPolicy
from app.execution.completion import CompletionService
from app.storage.journal_repo import CONSUMED, QUARANTINED, JournalRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.worker.log_facts import LogFacts
from app.worker.receipts import ReceiptStore
from tests.kit.crash import crash_in_step
from tests.worker.kit import Armed, CrashAfterCommit, armed_run, make_log, terminal_events

HANDLE = ProcessHandle(boot_id="b", pid=10, pgid=10, start_ticks=5, shim_pid=9, shim_start_ticks=4)


class Env:
    def __init__(self, engine: Engine, root: Path) -> None:
        self.engine = engine
        self.store = ReceiptStore(root / "receipts")
        self.journal = JournalRepository(engine)
        self.runs = RunRepository(engine)
        self.logs = root / "logs"
        self.service = CompletionService(
            receipts=self.store, journal=self.journal, completions=self.runs,
            log_facts=LogFacts(self.logs),
        )

    def running(self, retry: RetryPolicy | None = None) -> Armed:
        armed = armed_run(self.engine, retry=retry)
        self.journal.reserve(
            attempt_id=armed.attempt_id, run_id=armed.run_id,
            receipt_ref=receipt_relpath(armed.attempt_id),
        )
        self.journal.record_spawned(attempt_id=armed.attempt_id, handle=HANDLE)
        self.runs.record_running(
            run_id=armed.run_id, attempt_id=armed.attempt_id, handle=HANDLE,
            started_at_ms=now_ms(),
        )
        return armed

    def publish(self, armed: Armed, body: bytes | None = None, **over: Any) -> Path:
        self.store.ensure_shard(armed.attempt_id)
        at = now_ms()
        fields: dict[str, Any] = {
            "run_id": armed.run_id, "attempt_id": armed.attempt_id, "callback_sequence": 1,
            "token": armed.token, "started_at_ms": at, "finished_at_ms": at, "exit_code": 0,
        } | over
        path = self.store.path_of(armed.attempt_id)
        path.write_bytes(body if body is not None else encode_receipt(Receipt(**fields)))
        return path

    def run(self, armed: Armed) -> Any:
        return RunReader(self.engine).get_run(armed.run_id)


@pytest.fixture
def env(engine: Engine, tmp_path: Path) -> Env:
    return Env(engine, tmp_path)


def test_absent_receipt_changes_nothing(env: Env) -> None:
    armed = env.running()
    assert env.service.consume(run_id=armed.run_id, attempt_id=armed.attempt_id).status == "absent"
    assert env.run(armed).status == "running"


@pytest.mark.parametrize(
    ("over", "status", "exit_code", "signal"),
    [({"exit_code": 0}, "succeeded", 0, None), ({"exit_code": 3}, "failed", 3, None),
     ({"exit_code": 137, "signal": 9}, "failed", None, 9)],
)
def test_receipt_applies_once_and_is_cleaned(
    env: Env, over: dict[str, Any], status: str, exit_code: int | None, signal: int | None
) -> None:
    armed = env.running()
    log = make_log(env.logs, armed.attempt_id)
    log.write_bytes(b"hello\n")
    (log.parent / (log.name + ".truncated")).write_text(
        json.dumps({"droppedBytes": 42, "gapAt": 4, "quotaBytes": 6, "schemaVersion": 1})
    )
    path = env.publish(armed, **over)
    result = env.service.consume(run_id=armed.run_id, attempt_id=armed.attempt_id)
    assert (result.status, result.run_status) == ("applied", status)
    run = env.run(armed)
    attempt = run.latest_attempt
    assert run.status == status and attempt.exit_code == exit_code and attempt.signal == signal
    assert attempt.log is not None
    assert (attempt.log.bytes, attempt.log.truncated, attempt.log.dropped_bytes) == (6, True, 42)
    assert attempt.log.dropped_at == 4  # where the gap is: the last 2 bytes are the output's end
    assert not path.exists()
    entry = env.journal.get(armed.attempt_id)
    assert entry is not None and entry.state == CONSUMED
    assert env.service.consume(run_id=armed.run_id, attempt_id=armed.attempt_id).status == "absent"
    assert len(terminal_events(env.engine, armed.run_id)) == 2


def test_crash_inside_the_transaction_replays_to_one_ending(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    armed = env.running()
    path = env.publish(armed, exit_code=3)
    crash_in_step(monkeypatch, env.engine, "injected crash inside the terminal transaction")
    with pytest.raises(RuntimeError):
        env.service.consume(run_id=armed.run_id, attempt_id=armed.attempt_id)
    assert env.run(armed).status == "running"  # rolled back: nothing committed
    assert path.exists()  # never deleted before the commit
    entry = env.journal.get(armed.attempt_id)
    assert entry is not None and entry.state == "spawned"
    monkeypatch.undo()
    result = env.service.consume(run_id=armed.run_id, attempt_id=armed.attempt_id)
    assert (result.status, result.run_status) == ("applied", "failed")
    assert terminal_events(env.engine, armed.run_id) == ["attempt.failed", "run.failed"]
    assert not path.exists()


def test_crash_between_commit_and_cleanup_leaves_only_the_file(env: Env) -> None:
    armed = env.running()
    path = env.publish(armed, exit_code=0)
    crashing = CompletionService(
        receipts=CrashAfterCommit(env.store), journal=env.journal, completions=env.runs,
        log_facts=LogFacts(env.logs),
    )  # fmt: skip
    with pytest.raises(RuntimeError):
        crashing.consume(run_id=armed.run_id, attempt_id=armed.attempt_id)
    # The ending and the journal's consumed mark committed together; the file is left.
    assert env.run(armed).status == "succeeded" and path.exists()
    entry = env.journal.get(armed.attempt_id)
    assert entry is not None and entry.state == CONSUMED
    # Consuming again (a racing watcher, the reconciler) changes nothing but the file.
    result = env.service.consume(run_id=armed.run_id, attempt_id=armed.attempt_id)
    assert (result.status, result.run_status) == ("already_terminal", "succeeded")
    assert not path.exists()
    entry = env.journal.get(armed.attempt_id)
    assert entry is not None and entry.state == CONSUMED
    assert terminal_events(env.engine, armed.run_id) == ["attempt.succeeded", "run.succeeded"]


def _crash_after_the_ending_then_consume(
    env: Env, monkeypatch: pytest.MonkeyPatch, armed: Armed, path: Path, run_status: str
) -> Any:
    """Crash after ``end_attempt_in`` wrote the ending (``run_status``) and the journal's
    consumed, before the commit: both roll back together, neither exists. Then consume
    again without the crash; its result."""
    real = runs_repo_module.end_attempt_in

    def end_then_crash(*args: Any, **kwargs: Any) -> Any:
        # One statement on PostgreSQL, the journal's after the step's on SQLite.
        written = real(*args, **kwargs)
        assert written.run_values["status"] == run_status and written.counts == {"journal": 1}
        raise RuntimeError("injected crash after the journal step, before the commit")

    monkeypatch.setattr(runs_repo_module, "end_attempt_in", end_then_crash)
    with pytest.raises(RuntimeError):
        env.service.consume(run_id=armed.run_id, attempt_id=armed.attempt_id)
    assert env.run(armed).status == "running" and path.exists()
    entry = env.journal.get(armed.attempt_id)
    assert entry is not None and entry.state == "spawned"
    monkeypatch.setattr(runs_repo_module, "end_attempt_in", real)
    result = env.service.consume(run_id=armed.run_id, attempt_id=armed.attempt_id)
    entry = env.journal.get(armed.attempt_id)
    assert entry is not None and entry.state == CONSUMED
    assert not path.exists()
    return result


def test_the_journal_mark_is_part_of_the_terminal_transaction(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    armed = env.running()
    path = env.publish(armed, exit_code=0)
    result = _crash_after_the_ending_then_consume(env, monkeypatch, armed, path, "succeeded")
    assert (result.status, result.run_status) == ("applied", "succeeded")
    assert terminal_events(env.engine, armed.run_id) == ["attempt.succeeded", "run.succeeded"]


def test_an_ending_that_schedules_a_retry_consumes_the_entry_in_its_transaction(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure under a retry policy moves the run back to ``queued`` with a new attempt
    (several statements on both engines); the journal's consumed is part of that same
    transaction: a crash before its commit leaves neither, and the retry consumes once."""
    armed = env.running(retry=RetryPolicy(max_attempts=2, initial_delay_seconds=60.0))
    path = env.publish(armed, exit_code=1)
    result = _crash_after_the_ending_then_consume(env, monkeypatch, armed, path, "queued")
    assert (result.status, result.run_status) == ("applied", "queued")
    run = env.run(armed)
    assert run.status == "queued" and run.latest_attempt is not None
    assert run.latest_attempt.number == 2 and run.latest_attempt.status == "claimed"


def _bad_bodies(armed: Armed) -> dict[str, bytes]:
    good = json.loads(
        encode_receipt(
            Receipt(armed.run_id, armed.attempt_id, 1, armed.token, 1, 2, 0)
        )
    )
    raw = json.dumps(good)
    return {
        "UNKNOWN_KEY": json.dumps(good | {"extra": 1}).encode(),
        "DUPLICATE_KEY": (raw[:-1] + ', "exitCode": 0}').encode(),
        "NOT_INTEGER": json.dumps(good | {"exitCode": 1.0}).encode(),
        "OUT_OF_RANGE": json.dumps(good | {"exitCode": 256}).encode(),
        "OVERSIZE": b" " * 5000 + raw.encode(),
        "NOT_JSON": b'{"schemaVersion": 1, "runId": ',  # a half-written file
        "WRONG_TOKEN": json.dumps(good | {"token": "A" * 43}).encode(),
        "WRONG_SEQUENCE": json.dumps(good | {"callbackSequence": 0}).encode(),
    }


@pytest.mark.parametrize(
    "kind",
    ["UNKNOWN_KEY", "DUPLICATE_KEY", "NOT_INTEGER", "OUT_OF_RANGE", "OVERSIZE", "NOT_JSON",
     "WRONG_TOKEN", "WRONG_SEQUENCE", "WRONG_IDS"],
)
def test_bad_receipts_are_quarantined_and_the_run_is_untouched(
    env: Env, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    armed = env.running()
    other = env.running()
    if kind == "WRONG_IDS":
        # A valid receipt of another attempt sitting under this attempt's name.
        body = encode_receipt(Receipt(other.run_id, other.attempt_id, 1, other.token, 1, 2, 0))
    else:
        body = _bad_bodies(armed)[kind]
    path = env.publish(armed, body=body)
    before = env.run(armed)
    with caplog.at_level(logging.WARNING, logger="app.execution.completion"):
        result = env.service.consume(run_id=armed.run_id, attempt_id=armed.attempt_id)
    assert result.status == "quarantined" and result.reason
    # One line for the operator, with codes only: never the receipt's bytes or its token.
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"receipt of attempt {armed.attempt_id} quarantined (reason {result.reason})"]
    assert armed.token not in said[0]
    if kind == "WRONG_SEQUENCE":
        assert result.reason in ("OUT_OF_RANGE", "WRONG_SEQUENCE")  # codec catches 0 first
    after = env.run(armed)
    assert (after.status, after.version) == (before.status, before.version)
    entry = env.journal.get(armed.attempt_id)
    assert entry is not None and entry.state == QUARANTINED
    assert not path.exists()
    assert (env.store.root / quarantine_relpath(armed.attempt_id)).read_bytes() == body
    assert terminal_events(env.engine, armed.run_id) == []


def test_log_facts_count_only_a_regular_log_file(tmp_path: Path) -> None:
    facts = LogFacts(tmp_path)
    regular, link, fifo, missing = uuid7(), uuid7(), uuid7(), uuid7()
    for attempt in (regular, link, fifo):
        (tmp_path / log_relpath(attempt)).parent.mkdir(exist_ok=True)
    (tmp_path / log_relpath(regular)).write_bytes(b"12345")
    (tmp_path / log_relpath(link)).symlink_to(tmp_path / log_relpath(regular))
    os.mkfifo(tmp_path / log_relpath(fifo))  # never opened, so never blocks
    assert facts.log_info(regular) == LogInfo(bytes=5, truncated=False, dropped_bytes=0)
    assert [facts.log_info(a) for a in (link, fifo, missing)] == [None, None, None]
