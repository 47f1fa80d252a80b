"""Receipt journal (real SQLite/PostgreSQL) and receipt file store (real files)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.domain.artifacts import quarantine_relpath
from app.domain.errors import ReceiptInvalid
from app.domain.ids import uuid7
from app.domain.model import ProcessHandle
from app.domain.receipt import RECEIPT_MAX_BYTES
from app.storage.journal_repo import (
    CONSUMED,
    QUARANTINED,
    RESERVED,
    SPAWN_FAILED,
    SPAWNED,
    AlreadyReserved,
    JournalRepository,
)
from app.worker import receipts as receipts_module
from app.worker.receipts import ReceiptStore

HANDLE = ProcessHandle(
    boot_id="b", pid=10, pgid=10, start_ticks=5, shim_pid=9, shim_start_ticks=4
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_reserve_is_committed_once_and_moves_forward(engine: Engine) -> None:
    journal = JournalRepository(engine)
    attempt, run = uuid7(), uuid7()
    journal.reserve(attempt_id=attempt, run_id=run, receipt_ref="x/y.json")
    with pytest.raises(AlreadyReserved) as info:
        journal.reserve(attempt_id=attempt, run_id=run, receipt_ref="x/y.json")
    assert info.value.entry.state == RESERVED
    assert journal.record_spawned(attempt_id=attempt, handle=HANDLE)
    assert not journal.record_spawn_failed(attempt_id=attempt)  # not from spawned
    entry = journal.get(attempt)
    assert entry is not None and entry.state == SPAWNED and entry.handle == HANDLE
    assert journal.mark_consumed(attempt_id=attempt)
    assert not journal.mark_quarantined(attempt_id=attempt, reason="LATE")
    assert not journal.mark_consumed(attempt_id=attempt)
    final = journal.get(attempt)
    assert final is not None and final.state == CONSUMED


def test_spawn_failed_and_quarantined_states_and_pages(engine: Engine) -> None:
    journal = JournalRepository(engine)
    ids = [uuid7() for _ in range(5)]
    for attempt in ids:
        journal.reserve(attempt_id=attempt, run_id=uuid7(), receipt_ref="r")
    assert journal.record_spawn_failed(attempt_id=ids[0])
    for attempt in ids[1:]:
        journal.record_spawned(attempt_id=attempt, handle=HANDLE)
    assert journal.mark_quarantined(attempt_id=ids[1], reason="WRONG_TOKEN")
    q = journal.get(ids[1])
    assert q is not None and q.state == QUARANTINED and q.quarantine_reason == "WRONG_TOKEN"
    assert [e.attempt_id for e in journal.page_by_state(state=SPAWN_FAILED, limit=10)] == [ids[0]]
    seen: list[str] = []
    after = None
    while True:
        page = journal.page_by_state(state=SPAWNED, limit=2, after=after)
        seen += [e.attempt_id for e in page]
        if len(page) < 2:
            break
        after = (page[-1].updated_at_ms, page[-1].attempt_id)
    assert sorted(seen) == sorted(ids[2:])
    with pytest.raises(ValueError):
        journal.page_by_state(state="bogus", limit=1)


def test_store_dirs_are_private_and_reads_are_bounded(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path / "receipts")
    attempt = uuid7()
    shard = store.ensure_shard(attempt)
    assert _mode(store.root) == 0o700 and _mode(shard) == 0o700
    assert _mode(store.root / ".quarantine") == 0o700
    assert store.read(attempt) is None
    store.path_of(attempt).write_bytes(b"x" * (RECEIPT_MAX_BYTES * 3))
    assert len(store.read(attempt) or b"") == RECEIPT_MAX_BYTES + 1
    store.remove(attempt)
    store.remove(attempt)  # missing is fine
    assert not store.path_of(attempt).exists()
    shutil.rmtree(store.root)  # gone while the worker runs: the next shard brings it back
    shard = store.ensure_shard(uuid7())
    assert _mode(store.root) == 0o700 and _mode(shard) == 0o700
    assert _mode(store.root / ".quarantine") == 0o700


def test_every_shard_is_made_at_once_and_a_launch_then_syncs_no_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ReceiptStore(tmp_path / "receipts")
    store.ensure_root()
    (store.root / "0a").mkdir(mode=0o755)  # one already there, too wide: narrowed
    synced: list[Path] = []
    monkeypatch.setattr(receipts_module, "fsync_dir", lambda path: synced.append(Path(path)))
    assert store.ensure_shards() == 0
    assert synced == [store.root]
    shards = sorted(p.name for p in store.root.iterdir() if p.name != ".quarantine")
    assert shards == [f"{n:02x}" for n in range(256)]
    assert {_mode(store.root / name) for name in shards} == {0o700}
    assert store.ensure_shards() == 0  # nothing new: nothing synced
    for _ in range(20):
        assert store.ensure_shard(uuid7()).parent == store.root
    assert synced == [store.root]


def test_a_shard_that_is_not_a_directory_fails_its_launches_only(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path / "receipts")
    store.ensure_root()
    (store.root / "ff").write_bytes(b"")  # a file where the shard belongs
    assert store.ensure_shards() == 1
    assert (store.root / "fe").is_dir() and (store.root / "ff").is_file()
    attempt = uuid7()
    while not attempt.endswith("ff"):
        attempt = uuid7()
    with pytest.raises(NotADirectoryError):
        store.ensure_shard(attempt)


def test_store_refuses_symlinks_and_non_regular_files(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path / "receipts")
    attempt = uuid7()
    store.ensure_shard(attempt)
    target = tmp_path / "elsewhere.json"
    target.write_bytes(b"{}")
    store.path_of(attempt).symlink_to(target)
    with pytest.raises(ReceiptInvalid) as info:
        store.read(attempt)
    assert info.value.reason == "NOT_REGULAR"
    assert store.quarantine(attempt)  # the link itself moves; its target is untouched
    assert (store.root / quarantine_relpath(attempt)).is_symlink()
    assert target.read_bytes() == b"{}"
    fifo_attempt = uuid7()
    store.ensure_shard(fifo_attempt)
    os.mkfifo(store.path_of(fifo_attempt))
    with pytest.raises(ReceiptInvalid):
        store.read(fifo_attempt)  # never blocks on a FIFO


def test_quarantine_moves_once_and_replays_after_a_crash(tmp_path: Path) -> None:
    store = ReceiptStore(tmp_path / "receipts")
    attempt = uuid7()
    store.ensure_shard(attempt)
    src = store.path_of(attempt)
    src.write_bytes(b"bad")
    dst = store.root / quarantine_relpath(attempt)
    # A crash after link() and before unlink(): both names exist for one inode.
    dst.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.link(src, dst)
    assert store.quarantine(attempt)
    assert not src.exists() and dst.read_bytes() == b"bad"
    assert _mode(dst.parent) == 0o700
    # A different file already quarantined under that name is never replaced.
    src.write_bytes(b"other")
    assert not store.quarantine(attempt)
    assert src.read_bytes() == b"other" and dst.read_bytes() == b"bad"
    store.remove_quarantined(attempt)
    assert not dst.exists()
