"""Start-up settling of a receipt backlog: each receipt consumed exactly once, on both engines.

A real worker (``WorkerProcess.start``, in this process) on a real database and receipts
directory: attempts whose shim is gone (a dead process) with a valid receipt waiting, attempts
that already ended but kept their receipt (a crash before cleanup), and ended attempts without
one. More than two drain pages, so paging is exercised; on PostgreSQL the backlog is settled
on several threads, and a reconciler runs its passes concurrently to race for the same files.
``start`` returns only after the backlog is settled, so everything is checked at once.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from app.context.worker_process import WorkerProcess
from app.domain.errors import ErrorCode
from app.domain.ids import now_ms
from app.domain.profiles import EDGE
from app.execution.journal_settle import JournalSettle
from app.execution.ports import JournalEntryView
from app.settings import Settings
from app.storage.journal_repo import CONSUMED, JournalRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.worker.receipts import ReceiptStore
from tests.recovery.kit import in_process_reconciler, terminal_events
from tests.worker.kit import Armed, dead_handle, running_run, write_receipt

PENDING = 140  # running, shim gone, receipt waiting: the backlog proper
REPLAYED = 20  # already succeeded, journal still spawned, receipt left behind
WITHOUT_RECEIPT = 10  # already lost, journal still spawned, no receipt and no shim
RACER = "racing-reconciler"


class Backlog:
    """Spawned journal entries of every kind the start-up drain meets, on the real stores."""

    def __init__(self, engine: Engine, data_dir: Path) -> None:
        self.engine = engine
        self.runs = RunRepository(engine)
        self.journal = JournalRepository(engine)
        self.store = ReceiptStore(data_dir / "receipts")
        self.store.ensure_root()
        self.handle = dead_handle()
        self.run_ids: list[str] = []
        self.attempt_ids: list[str] = []

    def spawned(self) -> tuple[Armed, int]:
        """A running attempt with a ``spawned`` journal entry and the dead handle."""
        armed, started = running_run(self.engine, self.handle)
        self.run_ids.append(armed.run_id)
        self.attempt_ids.append(armed.attempt_id)
        return armed, started

    def build(self) -> None:
        for _ in range(PENDING):
            write_receipt(self.store, *self.spawned())
        for _ in range(REPLAYED):
            r = write_receipt(self.store, *self.spawned())
            outcome = self.runs.complete_attempt(
                run_id=r.run_id,
                attempt_id=r.attempt_id,
                token=r.token,
                callback_sequence=r.callback_sequence,
                exit_code=r.exit_code,
                signal=r.signal,
                finished_at_ms=r.finished_at_ms,
                started_at_ms=r.started_at_ms,
            )
            assert outcome.status == "applied"
        for _ in range(WITHOUT_RECEIPT):
            armed, _ = self.spawned()
            self.runs.fail_attempt(
                run_id=armed.run_id,
                attempt_id=armed.attempt_id,
                error_code=ErrorCode.RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT,
                lost=True,
            )


@pytest.fixture
def backlog(engine: Engine, tmp_path: Path) -> Backlog:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    b = Backlog(engine, data_dir)
    b.build()
    return b


class Settles:
    """(attempt id, thread name) of every settle the start-up drain made (a spy, no fake)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.begun = threading.Event()
        self._lock = threading.Lock()

    def record(self, attempt_id: str) -> None:
        with self._lock:
            self.calls.append((attempt_id, threading.current_thread().name))
        self.begun.set()


@pytest.fixture
def settles(monkeypatch: pytest.MonkeyPatch) -> Iterator[Settles]:
    spy = Settles()
    real = JournalSettle._entry

    def settle(self: JournalSettle, entry: JournalEntryView, *, active: bool) -> Any:
        # The racing reconciler's sweep takes this same path: only the drain's are counted.
        if threading.current_thread().name != RACER:
            spy.record(entry.attempt_id)
        return real(self, entry, active=active)

    monkeypatch.setattr(JournalSettle, "_entry", settle)
    yield spy


def test_start_settles_the_backlog_exactly_once(
    engine: Engine,
    db_url: str,
    backlog: Backlog,
    short_dir: Path,
    settles: Settles,
) -> None:
    data_dir = backlog.store.root.parent
    settings = Settings(
        data_dir=data_dir, database_url=db_url, profile=EDGE, worker_socket=short_dir / "w.sock"
    )
    # A reconciler in another thread races the start-up drain for the very same receipts.
    reconciler = in_process_reconciler(engine, backlog.store, [now_ms()])
    stop = threading.Event()
    failures: list[BaseException] = []

    def race() -> None:
        try:
            settles.begun.wait(30)  # from the moment the start-up drain settles its first entry
            while not stop.is_set():
                reconciler.run_pass()
        except BaseException as exc:
            failures.append(exc)

    racer = threading.Thread(target=race, name=RACER)
    caller = threading.current_thread().name
    worker = WorkerProcess(settings)
    racer.start()
    try:
        worker.start()
    finally:
        stop.set()
        racer.join(30)
    try:
        assert not racer.is_alive() and not failures
        threads = {name for _, name in settles.calls}
        if engine.dialect.name == "sqlite":
            assert threads == {caller}  # one writer: settled inline, never on threads
        else:
            assert len(threads) > 1 and caller not in threads

        # The racer starts only once the drain settles, so (nearly) all of the backlog reaches
        # the drain; each attempt reaches it once, on one thread. Consumption itself may be
        # won by the racer: exactly once is checked on the database and files below.
        per_attempt = Counter(attempt for attempt, _ in settles.calls)
        assert set(per_attempt) <= set(backlog.attempt_ids)
        assert len(per_attempt) > len(backlog.attempt_ids) // 2
        assert max(per_attempt.values()) == 1

        reader = RunReader(engine)
        pending = set(backlog.run_ids[:PENDING])
        replayed = set(backlog.run_ids[PENDING : PENDING + REPLAYED])
        for run_id in backlog.run_ids:
            run = reader.get_run(run_id)
            wanted = "succeeded" if run_id in pending | replayed else "lost"
            assert run.status == wanted
            # One ending per run: run.<status> and attempt.<status>, never a second pair.
            assert sorted(terminal_events(engine, run_id)) == [f"attempt.{wanted}", f"run.{wanted}"]
        for attempt in backlog.attempt_ids:
            entry = backlog.journal.get(attempt)
            assert entry is not None and entry.state == CONSUMED
        left = [p for p in backlog.store.root.rglob("*") if p.is_file()]
        assert left == []  # every receipt removed, none quarantined
    finally:
        worker.shutdown()
