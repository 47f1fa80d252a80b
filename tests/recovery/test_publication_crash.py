"""kill -9 of a shim mid-publication: its temp file is removed through the journal.

The publication crash window (docs/design.md §3.11): the receipt's complete bytes sit in the shim's
temp file, ``link()`` has not happened. The shim stops itself right there (test hook), the
test SIGKILLs it. The attempt then ends ``lost`` exactly once (a temp is never evidence,
§6.4), and the temp goes when the journal entry is settled: found by the name derived from
the attempt id, never by listing the receipt directory (§2.8-2.9). Both engines.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine

from app.domain.artifacts import receipt_temp_relpath
from app.domain.errors import ErrorCode
from app.domain.ids import now_ms
from app.domain.profiles import EDGE
from app.domain.receipt import decode_receipt
from app.storage.journal_repo import CONSUMED, JournalRepository
from app.storage.run_reads import RunReader
from app.storage.runs_repo import RunRepository
from app.worker.identity import wait_exit
from app.worker.launcher import ShimLauncher
from app.worker.receipts import ReceiptStore
from tests.recovery.kit import in_process_reconciler, terminal_events, wait_for
from tests.worker.kit import Processes, armed_run, kill_exact, launch_request, make_log


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        data = fh.read()
    return data[data.rindex(b")") + 2 :].split()[0].decode()


def test_a_shim_killed_between_temp_write_and_link_leaves_no_temp_once_settled(
    engine: Engine, tmp_path: Path, procs: Processes
) -> None:
    store = ReceiptStore(tmp_path / "receipts", logs_root=tmp_path / "logs")
    store.ensure_root()
    journal = JournalRepository(engine)
    launcher = ShimLauncher(
        journal=journal, receipts=store, mode="exec",
        spec_extra={"test_hook": "stop_after_temp_write"},
    )  # fmt: skip
    try:
        armed = armed_run(engine)
        log = make_log(tmp_path / "logs", armed.attempt_id)
        request = launch_request(armed, argv=["/bin/sh", "-c", "echo out; exit 7"], log_path=log)
        handle = procs.track(launcher.launch(request))
    finally:
        launcher.close()
    RunRepository(engine).record_running(
        run_id=armed.run_id, attempt_id=armed.attempt_id, handle=handle, started_at_ms=now_ms()
    )
    temp = store.root / receipt_temp_relpath(armed.attempt_id)
    wait_for(lambda: _state(handle.shim_pid) == "T", "the shim stopped before link()")
    assert decode_receipt(temp.read_bytes()).exit_code == 7  # complete, never the final name
    kill_exact(handle.shim_pid, handle.shim_start_ticks)
    assert wait_exit(handle.shim_pid, 10)

    clock = [now_ms()]
    reconciler = in_process_reconciler(engine, store, clock)
    reconciler.run_pass()
    attempt = RunReader(engine).list_attempts(armed.run_id)[0]
    assert (attempt.status, attempt.error_code) == (
        "lost", ErrorCode.RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT,
    )  # fmt: skip
    assert terminal_events(engine, armed.run_id) == ["attempt.lost", "run.lost"]
    entry = journal.get(armed.attempt_id)
    assert entry is not None and entry.state == CONSUMED
    assert not store.path_of(armed.attempt_id).exists()

    clock[0] = now_ms() + int(EDGE.consumed_receipt_retention_s * 1000) + 1
    reconciler.run_pass()
    assert not temp.exists()  # removed by its derived name when the entry was settled
    assert journal.get(armed.attempt_id) is None
    assert terminal_events(engine, armed.run_id) == ["attempt.lost", "run.lost"]
