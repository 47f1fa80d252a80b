"""kill -9 of the worker inside a launch, at the two points of ADR-0070 §3 (journal, spawn).

The worker is the real ``qinglong worker`` halted at a named point (``crash_worker.py``) and
SIGKILLed there by pid; T1 was committed as the coordinator does, and T2 never comes (the
launch answer is lost). A normal worker then restarts on the same data; the start grace is
passed with the reconciler's injected clock, never waited for.
"""

from __future__ import annotations

from app.domain.errors import ErrorCode
from app.domain.ids import now_ms
from app.domain.profiles import EDGE
from app.execution.reconciler import DEFAULT_START_GRACE_S, RESERVED_EXTRA_GRACE_S
from app.storage.journal_repo import RESERVED
from app.worker.identity import read_identity
from tests.recovery.kit import (
    HaltingWorker,
    Rig,
    gated,
    in_process_reconciler,
    terminal_events,
    wait_for,
)

PAST_THE_GRACE_MS = int((DEFAULT_START_GRACE_S + RESERVED_EXTRA_GRACE_S) * 1000) + 1


def test_killed_after_the_journal_reserve_before_the_spawn(rig: Rig) -> None:
    halting = HaltingWorker(rig, "reserved")
    halting.start()
    a = rig.arm()
    try:
        halting.launch_until_halted(a, gated("never", then="exit 0"))
    finally:
        halting.close()
    entry = rig.journal.get(a.attempt_id)
    assert entry is not None and (entry.state, entry.handle) == (RESERVED, None)
    assert rig.log_bytes(a) == b""  # nothing ever ran
    rig.worker.start()  # replaces the stale socket; the reserved entry is young: kept
    assert rig.run(a).status == "dispatching"
    clock = [now_ms() + PAST_THE_GRACE_MS]
    in_process_reconciler(rig.engine, rig.store, clock).run_pass()
    run = rig.run(a)
    assert run.latest_attempt is not None
    # Nothing ran here, but recovery cannot tell this from the spawned-unrecorded case
    # below (both leave a reserved entry without a handle): lost, never a clean ending.
    assert (run.status, run.latest_attempt.error_code) == (
        "lost",
        ErrorCode.RECOVERY_IDENTITY_UNSUPPORTED.value,
    )
    assert terminal_events(rig.engine, a.run_id) == ["attempt.lost", "run.lost"]


def test_killed_after_the_spawn_before_spawned_is_journaled(rig: Rig) -> None:
    halting = HaltingWorker(rig, "spawned")
    halting.start()
    a = rig.arm()
    pid_file = rig.gate("job.pid")
    try:
        halting.launch_until_halted(
            a,
            gated("g", then="exit 0").replace("echo start", f"echo $$ > {pid_file}; echo start", 1),
        )
    finally:
        halting.close()
    wait_for(lambda: b"start" in rig.log_bytes(a), "the job to run")
    job_pid = int(pid_file.read_text())
    rig.procs.track_pid(job_pid)
    entry = rig.journal.get(a.attempt_id)
    assert entry is not None and (entry.state, entry.handle) == (RESERVED, None)
    rig.worker.start()
    clock = [now_ms() + PAST_THE_GRACE_MS]
    in_process_reconciler(rig.engine, rig.store, clock).run_pass()
    # ADR-0070 §4 / DESIGN.md: never a clean ending while the process may still run; the
    # identity was never journaled, so recovery can neither stop nor watch it: lost.
    run = rig.run(a)
    assert read_identity(job_pid) is not None  # the job runs on, unidentified
    assert run.latest_attempt is not None
    assert (run.status, run.latest_attempt.error_code) == (
        "lost",
        ErrorCode.RECOVERY_IDENTITY_UNSUPPORTED.value,
    )
    assert terminal_events(rig.engine, a.run_id) == ["attempt.lost", "run.lost"]
    # The job then ends and its shim publishes a receipt: no second ending, and retention
    # removes the file with the consumed journal row.
    rig.gate("g").touch()
    receipt = rig.store.path_of(a.attempt_id)
    wait_for(receipt.exists, "the late receipt")
    later = [clock[0] + int(EDGE.consumed_receipt_retention_s * 1000) + 1]
    in_process_reconciler(rig.engine, rig.store, later).run_pass()
    assert rig.run(a).status == "lost"
    assert terminal_events(rig.engine, a.run_id) == ["attempt.lost", "run.lost"]
    assert not receipt.exists() and rig.journal.get(a.attempt_id) is None
