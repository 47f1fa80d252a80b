"""kill -9 of the worker inside a launch, at the two points of docs/design.md §3.9 (journal, spawn).

The worker is the real ``qinglong worker`` halted at a named point (``crash_worker.py``) and
SIGKILLed there by pid; T1 was committed as the coordinator does, and T2 never comes (the
launch answer is lost). A normal worker then restarts on the same data; the start grace is
passed with the reconciler's injected clock, never waited for.

A ``reserved`` entry without a handle is settled by the shim's receipt reservation
(docs/reserved-launch.md): recovery takes that name first (nothing was spawned: requeue),
or finds the identity of the shim that took it (alive: keep, its receipt ends the attempt;
gone: lost, fail closed).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.domain.artifacts import log_artifact_id, receipt_temp_relpath
from app.domain.canonical import sha256_digest
from app.domain.errors import ErrorCode, LaunchFailed
from app.domain.ids import now_ms
from app.domain.profiles import EDGE
from app.domain.tokens import new_callback_token
from app.execution.reconciler import DEFAULT_START_GRACE_S, RESERVED_EXTRA_GRACE_S
from app.storage.journal_repo import RESERVED, SPAWN_FAILED
from app.worker.identity import read_identity, wait_exit
from app.worker.receipts import FENCE_MARK
from tests.recovery.kit import (
    Armed,
    HaltingWorker,
    Rig,
    gated,
    in_process_reconciler,
    terminal_events,
    wait_for,
)
from tests.worker.kit import kill_exact

PAST_THE_GRACE_MS = int((DEFAULT_START_GRACE_S + RESERVED_EXTRA_GRACE_S) * 1000) + 1


def _rearm(rig: Rig, run_id: str) -> Armed:
    """T1 for the run's fresh attempt, as the next dispatch would commit it."""
    run = rig.reader.get_run(run_id)
    assert run.latest_attempt is not None and run.latest_attempt.status == "claimed"
    token = new_callback_token()
    rig.runs.begin_dispatch(
        run_id=run_id, attempt_id=run.latest_attempt.id, expected_version=run.version,
        token_digest=sha256_digest(token.encode("utf-8")), deadline_at_ms=None,
        log_artifact_id=log_artifact_id(run.latest_attempt.id),
    )  # fmt: skip
    return Armed(run_id, run.latest_attempt.id, token)


def _fence_path(rig: Rig, attempt_id: str) -> Path:
    return rig.store.root / receipt_temp_relpath(attempt_id)


def _halt_in_a_running_job(rig: Rig, script: str) -> tuple[Armed, int]:
    """Kill the worker after the shim reported, before ``spawned`` is journaled."""
    halting = HaltingWorker(rig, "spawned")
    halting.start()
    a = rig.arm()
    pid_file = rig.gate("job.pid")
    try:
        halting.launch_until_halted(
            a, script.replace("echo start", f"echo $$ > {pid_file}; echo start", 1)
        )
    finally:
        halting.close()
    wait_for(lambda: b"start" in rig.log_bytes(a), "the job to run")
    job_pid = int(pid_file.read_text())
    rig.procs.track_pid(job_pid)
    rig.procs.track_cgroup(f"ql-{a.attempt_id}")  # its shim may be killed: nobody removes it
    entry = rig.journal.get(a.attempt_id)
    assert entry is not None and (entry.state, entry.handle) == (RESERVED, None)
    return a, job_pid


def _shim_pid_of(job_pid: int) -> int:
    with open(f"/proc/{job_pid}/stat", "rb") as fh:
        data = fh.read()
    return int(data[data.rindex(b")") + 2 :].split()[1])  # the ppid: the shim


def test_killed_after_the_journal_reserve_before_the_spawn_requeues(rig: Rig) -> None:
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
    report = in_process_reconciler(rig.engine, rig.store, clock).run_pass()
    # Recovery took the shim's reservation name first: no shim can start this job any more,
    # so nothing of it can ever run and the run goes back to the queue (docs/backlog-requeue.md).
    assert report.requeued == 1 and report.lost == 0
    rig.assert_requeued(a)
    assert _fence_path(rig, a.attempt_id).read_bytes() == FENCE_MARK
    # The fresh attempt runs and succeeds once dispatched.
    b = _rearm(rig, a.run_id)
    rig.launch(b, gated("go", then="exit 0"))  # gated: T2 commits before it can end
    rig.gate("go").touch()
    run = rig.wait_status(b)
    assert run.latest_attempt is not None
    assert (run.status, run.latest_attempt.number, run.latest_attempt.exit_code) == (
        "succeeded", 2, 0,
    )  # fmt: skip
    assert terminal_events(rig.engine, a.run_id) == [
        "attempt.failed", "attempt.succeeded", "run.succeeded",
    ]  # fmt: skip
    # Retention removes the fence file with the fenced row, through the journal.
    later = [clock[0] + int(EDGE.consumed_receipt_retention_s * 1000) + 1]
    in_process_reconciler(rig.engine, rig.store, later).run_pass()
    assert rig.journal.get(a.attempt_id) is None
    assert not _fence_path(rig, a.attempt_id).exists()


def test_a_shim_that_comes_after_the_fence_starts_nothing(rig: Rig) -> None:
    # The shim's O_EXCL reservation is the claim recovery races: whichever comes second
    # loses. Here recovery won; the launch that arrives later must spawn nothing and leave
    # the fence in place (a refused reservation never removes a file it did not create).
    rig.worker.start(t2=False)
    a = rig.arm()
    assert rig.store.claim_reservation(a.attempt_id) == "fenced"
    marker = rig.gate("ran")
    with pytest.raises(LaunchFailed) as failed:
        rig.spawn(a, f"touch {marker}")
    assert failed.value.reason == "RECEIPT_RESERVE_FAILED"
    entry = rig.journal.get(a.attempt_id)
    assert entry is not None and entry.state == SPAWN_FAILED
    assert rig.log_bytes(a) == b"" and not marker.exists()
    assert _fence_path(rig, a.attempt_id).read_bytes() == FENCE_MARK


def test_killed_after_the_spawn_with_the_shim_alive_ends_with_the_real_exit_code(
    rig: Rig,
) -> None:
    a, job_pid = _halt_in_a_running_job(rig, gated("g", then="exit 3"))
    rig.worker.start()
    clock = [now_ms() + PAST_THE_GRACE_MS]
    report = in_process_reconciler(rig.engine, rig.store, clock).run_pass()
    # The live shim holds the reservation with its identity: kept, never lost, not requeued.
    assert (report.kept, report.lost, report.requeued) == (1, 0, 0)
    assert rig.run(a).status == "dispatching" and read_identity(job_pid) is not None
    rig.gate("g").touch()
    receipt = rig.store.path_of(a.attempt_id)
    wait_for(lambda: receipt.exists() or rig.run(a).status != "dispatching", "the receipt")
    in_process_reconciler(rig.engine, rig.store, clock).run_pass()  # the worker's may be first
    run = rig.wait_status(a)
    assert run.latest_attempt is not None
    assert (run.status, run.latest_attempt.exit_code) == ("failed", 3)
    assert terminal_events(rig.engine, a.run_id) == ["attempt.failed", "run.failed"]
    assert rig.log_bytes(a).startswith(b"start\n")
    assert not receipt.exists() and not _fence_path(rig, a.attempt_id).exists()


def test_killed_after_the_spawn_with_the_shim_gone_is_lost(rig: Rig) -> None:
    a, job_pid = _halt_in_a_running_job(rig, gated("g", then="exit 0"))
    shim_pid = _shim_pid_of(job_pid)
    ident = read_identity(shim_pid)
    assert ident is not None
    kill_exact(shim_pid, ident.start_ticks)  # the shim dies; its job runs on, unidentified
    assert wait_exit(shim_pid, 5.0)
    rig.worker.start()
    clock = [now_ms() + PAST_THE_GRACE_MS]
    in_process_reconciler(rig.engine, rig.store, clock).run_pass()
    # docs/design.md §3.8: never a clean ending while the process may still run, and
    # never a requeue (it would run the job twice); its identity was never journaled, so
    # recovery can neither stop nor watch it: lost.
    run = rig.run(a)
    assert read_identity(job_pid) is not None
    assert run.latest_attempt is not None
    assert (run.status, run.latest_attempt.error_code) == (
        "lost",
        ErrorCode.RECOVERY_IDENTITY_UNSUPPORTED.value,
    )
    assert terminal_events(rig.engine, a.run_id) == ["attempt.lost", "run.lost"]
    # Retention removes the shim's reservation through the consumed journal row.
    later = [clock[0] + int(EDGE.consumed_receipt_retention_s * 1000) + 1]
    in_process_reconciler(rig.engine, rig.store, later).run_pass()
    assert rig.journal.get(a.attempt_id) is None
    assert not _fence_path(rig, a.attempt_id).exists()
