"""Retention of the receipt journal and of quarantined files by profile (docs/design.md §4).

In-process against the real repositories and receipt store; time is an injected clock, so
"older than retention" needs no waiting. Purges are bounded per pass (pages x page size).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.domain.artifacts import quarantine_relpath, receipt_relpath
from app.domain.errors import ErrorCode
from app.domain.ids import now_ms
from app.domain.model import ProcessHandle
from app.domain.profiles import EDGE
from app.storage.journal_repo import JournalRepository
from app.storage.runs_repo import RunRepository
from app.worker import receipts
from app.worker.receipts import ReceiptStore
from tests.recovery.kit import in_process_reconciler
from tests.worker.kit import armed_run

HANDLE = ProcessHandle(boot_id="b", pid=10, pgid=10, start_ticks=5, shim_pid=9, shim_start_ticks=4)


def _journaled(engine: Engine, *, end: bool) -> str:
    armed = armed_run(engine)
    journal = JournalRepository(engine)
    journal.reserve(
        attempt_id=armed.attempt_id, run_id=armed.run_id,
        receipt_ref=receipt_relpath(armed.attempt_id),
    )
    journal.record_spawned(attempt_id=armed.attempt_id, handle=HANDLE)
    if end:
        RunRepository(engine).fail_attempt(
            run_id=armed.run_id, attempt_id=armed.attempt_id, error_code=ErrorCode.RECOVERY_IDENTITY_UNSUPPORTED,
            lost=True,
        )
    return armed.attempt_id


def _quarantine_file(store: ReceiptStore, attempt_id: str) -> Path:
    store.ensure_shard(attempt_id)
    store.path_of(attempt_id).write_bytes(b"{}")
    assert store.quarantine(attempt_id)
    return store.root / quarantine_relpath(attempt_id)


def test_settled_rows_and_quarantined_files_go_after_retention_bounded_per_pass(
    engine: Engine, tmp_path: Path
) -> None:
    store = ReceiptStore(tmp_path / "receipts")
    store.ensure_root()
    journal = JournalRepository(engine)
    consumed = [_journaled(engine, end=True) for _ in range(20)]
    for attempt_id in consumed:
        assert journal.mark_consumed(attempt_id=attempt_id)
    # A crash after the completion commit, before the file's removal, leaves the receipt.
    store.ensure_shard(consumed[0])
    left_behind = store.path_of(consumed[0])
    left_behind.write_bytes(b"{}")
    bad_ended = _journaled(engine, end=True)
    bad_active = _journaled(engine, end=False)  # its evidence is still needed
    files = {}
    for attempt_id in (bad_ended, bad_active):
        files[attempt_id] = _quarantine_file(store, attempt_id)
        assert journal.mark_quarantined(attempt_id=attempt_id, reason="WRONG_TOKEN")
    clock = [now_ms()]
    rec = in_process_reconciler(engine, store, clock)
    assert rec.purge_retention() == 0  # nothing is old enough yet
    clock[0] += int(EDGE.consumed_receipt_retention_s * 1000) + 1
    budget = EDGE.reconcile_pages * EDGE.reconcile_page_size
    assert rec.purge_retention() == budget  # bounded: 16 of 20 consumed rows
    assert rec.purge_retention() == 4
    assert all(journal.get(a) is None for a in consumed)
    assert not left_behind.exists()  # the file went first, then the row
    assert files[bad_ended].exists()  # quarantine keeps longer (5 min on edge)
    clock[0] += int(EDGE.quarantine_retention_s * 1000)
    assert rec.purge_retention() == 1
    assert journal.get(bad_ended) is None and not files[bad_ended].exists()
    entry = journal.get(bad_active)
    assert entry is not None and entry.state == "quarantined" and files[bad_active].exists()


def test_receipt_removals_are_on_disk_before_their_rows_go(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The row is the only index of the file (nothing lists the directory): were the row's
    # delete to outlive a power cut that undid the unlink, the receipt would stay for good.
    # That holds for a file a crash left behind and for one the live path already unlinked
    # without an fsync.
    store = ReceiptStore(tmp_path / "receipts")
    journal = JournalRepository(engine)
    left_behind, unlinked = _journaled(engine, end=True), _journaled(engine, end=True)
    for attempt_id in (left_behind, unlinked):
        assert journal.mark_consumed(attempt_id=attempt_id)
        store.ensure_shard(attempt_id)
        store.path_of(attempt_id).write_bytes(b"{}")
    store.remove(unlinked)  # the completion path's removal
    steps: list[tuple[str, object]] = []
    fsync_dir, delete_settled = receipts.fsync_dir, JournalRepository.delete_settled

    def spy_fsync(path: Path) -> None:
        steps.append(("fsync", path))
        fsync_dir(path)

    def spy_delete(self: JournalRepository, *, attempt_id: str, state: str) -> bool:
        steps.append(("delete", attempt_id))
        return delete_settled(self, attempt_id=attempt_id, state=state)

    monkeypatch.setattr(receipts, "fsync_dir", spy_fsync)
    monkeypatch.setattr(JournalRepository, "delete_settled", spy_delete)
    clock = [now_ms() + int(EDGE.consumed_receipt_retention_s * 1000) + 1]
    assert in_process_reconciler(engine, store, clock).purge_retention() == 2
    assert not store.path_of(left_behind).exists()
    shards = {store.path_of(a).parent for a in (left_behind, unlinked)}
    fsyncs = [path for kind, path in steps if kind == "fsync"]
    assert sorted(fsyncs) == sorted(shards)  # each shard once, removed now or earlier
    assert [kind for kind, _ in steps] == ["fsync"] * len(shards) + ["delete"] * 2
