"""The reconciler's cases against a real worker, real jobs and real shims.

A full pass is triggered deterministically with the ``wake`` socket op (``reconcile``)
instead of waiting for the profile cadence; every wait is a bounded poll of the database or
of /proc.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from sqlalchemy import update

from app.domain.errors import ErrorCode
from app.domain.ids import now_ms
from app.domain.model import ProcessHandle
from app.storage.tables import attempts
from app.worker.cgroups import detect
from app.worker.identity import current_boot_id, read_identity, wait_exit
from tests.recovery.kit import (
    DEADLINE,
    Armed,
    Rig,
    gated,
    in_process_reconciler,
    terminal_events,
    wait_for,
)


def test_shim_killed_the_job_is_stopped_and_the_run_lost_never_succeeded(rig: Rig) -> None:
    rig.worker.start()
    a = rig.arm()
    h = rig.launch(a, gated("never", then="exit 0"))
    os.kill(h.shim_pid, signal.SIGKILL)  # the worker is the shim's parent: it reaps it
    rig.assert_ended(a, ErrorCode.RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT)
    assert wait_exit(h.pid, DEADLINE)  # the orphaned job was stopped by exact identity


def test_identity_mismatch_is_never_signalled(rig: Rig) -> None:
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        rig.procs.track_pid(bystander.pid)
        real = read_identity(bystander.pid)
        assert real is not None and real.pgid == bystander.pid
        # A durable handle whose pid was reused by an unrelated process (start ticks differ).
        forged = ProcessHandle(
            boot_id=current_boot_id(), pid=real.pid, pgid=real.pgid,
            start_ticks=real.start_ticks + 1, shim_pid=real.pid,
            shim_start_ticks=real.start_ticks + 1,
        )
        a = rig.arm()
        rig.runs.record_running(
            run_id=a.run_id, attempt_id=a.attempt_id, handle=forged, started_at_ms=now_ms()
        )
        rig.runs.request_cancel(run_id=a.run_id, reason="user")  # asks for a stop, too
        rig.worker.start()
        assert rig.worker.client.wake(reconcile=True)
        rig.assert_ended(a, ErrorCode.RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT)
        assert bystander.poll() is None and read_identity(bystander.pid) == real
    finally:
        bystander.kill()
        bystander.wait(DEADLINE)


def test_an_unverifiable_handle_is_lost_without_any_signal(rig: Rig) -> None:
    bystander = subprocess.Popen(["sleep", "60"])  # not a group leader: never ours to signal
    try:
        real = read_identity(bystander.pid)
        assert real is not None
        odd = ProcessHandle(
            boot_id=current_boot_id(), pid=real.pid, pgid=real.pgid,
            start_ticks=real.start_ticks, shim_pid=real.pid, shim_start_ticks=real.start_ticks,
        )
        a = rig.arm()
        rig.runs.record_running(
            run_id=a.run_id, attempt_id=a.attempt_id, handle=odd, started_at_ms=now_ms()
        )
        rig.worker.start()
        rig.assert_ended(a, ErrorCode.RECOVERY_IDENTITY_UNSUPPORTED)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait(DEADLINE)


def test_starting_without_a_journaled_spawn_is_fenced_then_requeued(rig: Rig) -> None:
    # The worker is up before T1, so the attempt's age at the first pass is the pass's own
    # latency, not the worker's start-up time (which, on a loaded host, passed the grace).
    rig.worker.start()
    a = rig.arm()  # T1 committed; the api died before it reached the worker
    assert rig.worker.client.wake(reconcile=True)
    assert rig.run(a).status == "dispatching"  # young: the launch may still be on its way
    rig.past_start_grace(a)
    assert rig.worker.client.wake(reconcile=True)
    rig.assert_requeued(a)


def test_starting_with_a_journaled_spawn_is_stopped_then_lost(rig: Rig) -> None:
    rig.worker.start(t2=False)
    a = rig.arm()
    h = rig.spawn(a, gated("never", then="exit 0"))  # T2 never comes: the api was killed
    wait_for(lambda: b"start" in rig.log_bytes(a), "the job to run")
    rig.past_start_grace(a)
    assert rig.worker.client.wake(reconcile=True)
    rig.assert_ended(a, ErrorCode.RECOVERY_START_INTERRUPTED)  # not the TERM receipt's "failed"
    assert wait_exit(h.pid, DEADLINE) and wait_exit(h.shim_pid, DEADLINE)
    wait_for(lambda: not rig.store.path_of(a.attempt_id).exists(), "the receipt cleanup")
    assert terminal_events(rig.engine, a.run_id) == ["attempt.lost", "run.lost"]


def test_a_start_after_a_long_queue_wait_is_left_alone(rig: Rig) -> None:
    # The grace counts from T1, not from enqueue: a run that waited a minute in the queue
    # and is now between its spawn and T2 must not be stopped as an interrupted start.
    rig.worker.start(t2=False)
    a = rig.arm()
    with rig.engine.begin() as conn:
        conn.execute(
            update(attempts)
            .where(attempts.c.id == a.attempt_id)
            .values(created_at_ms=attempts.c.created_at_ms - 60_000)
        )
    h = rig.spawn(a, gated("g", then="exit 0"))
    wait_for(lambda: b"start" in rig.log_bytes(a), "the job to run")
    report = in_process_reconciler(rig.engine, rig.store, [now_ms()]).run_pass()
    assert report.kept >= 1 and report.stopped == 0 and report.lost == 0
    assert rig.run(a).status == "dispatching" and read_identity(h.pid) is not None
    rig.gate("g").touch()  # the job ends normally and its ending is recorded
    run = rig.wait_status(a)
    assert run.status == "succeeded"
    assert terminal_events(rig.engine, a.run_id) == ["attempt.succeeded", "run.succeeded"]


def test_an_ended_attempt_whose_process_still_runs_is_stopped(rig: Rig) -> None:
    rig.worker.start(t2=False)
    a = rig.arm()
    h = rig.spawn(a, gated("never", then="exit 0"))
    # The coordinator gave up (e.g. the launch answer was lost) and recorded an ending.
    rig.runs.fail_attempt(
        run_id=a.run_id, attempt_id=a.attempt_id, error_code=ErrorCode.EXECUTOR_START_FAILED
    )
    assert rig.worker.client.wake(reconcile=True)
    assert wait_exit(h.pid, DEADLINE)
    wait_for(lambda: _journal_state(rig, a) == "consumed", "the journal entry to settle")
    assert terminal_events(rig.engine, a.run_id) == ["attempt.failed", "run.failed"]


def _journal_state(rig: Rig, a: Armed) -> str | None:
    entry = rig.journal.get(a.attempt_id)
    return None if entry is None else entry.state




def test_a_dead_shims_job_that_ended_leaves_nothing_of_its_cgroup(rig: Rig) -> None:
    """docs/leftovers.md: the shim SIGKILLed, then the main process exits: its setsid child
    still runs in the job's cgroup, and the reconciler stops it before recording ``lost``."""
    rig.worker.start()
    a = rig.arm()
    pidfile = rig.data_dir / "escapee.pid"
    h = rig.launch(a, gated("g", then="exit 0").replace(
        "echo start", f"setsid sleep 300 & echo $! > {pidfile}; echo start", 1
    ))  # fmt: skip
    if h.cgroup is None:
        pytest.skip("no writable cgroup v2 here: the process tree is the only net")
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "", "the escapee")
    escapee = int(pidfile.read_text())
    rig.procs.track_pid(escapee)
    os.kill(h.shim_pid, signal.SIGKILL)
    rig.gate("g").touch()
    assert wait_exit(h.pid, DEADLINE)  # the main process ended on its own
    rig.assert_ended(a, ErrorCode.RECOVERY_PROCESS_EXITED_WITHOUT_RECEIPT)
    assert wait_exit(escapee, DEADLINE)  # and nothing of the job outlived its run
    assert terminal_events(rig.engine, a.run_id) == ["attempt.lost", "run.lost"]


def test_a_killed_shims_cgroup_is_removed_when_its_run_was_ended_elsewhere(rig: Rig) -> None:
    """The whole host was killed (shim and job with it); another host ended the run ``lost``
    meanwhile. This host's start-up finds the ended attempt's entry still ``spawned``: the
    job cgroup its killed shim never removed goes too (several-hosts walk-through)."""
    rig.worker.start()
    a = rig.arm()
    h = rig.launch(a, gated("never", then="exit 0"))
    if h.cgroup is None:
        pytest.skip("no writable cgroup v2 here: nothing to leave behind")
    root = detect("")
    assert root is not None
    path = root.job_dir(h.cgroup)
    assert path is not None
    wait_for(lambda: b"start" in rig.log_bytes(a), "the job to run")
    rig.kill_worker()
    os.kill(h.shim_pid, signal.SIGKILL)
    os.killpg(h.pgid, signal.SIGKILL)
    assert wait_exit(h.pid, DEADLINE)
    wait_for(lambda: (path / "cgroup.procs").read_text() == "", "the job's processes to end")
    assert path.exists()  # what a killed shim leaves
    rig.runs.fail_attempt(
        run_id=a.run_id, attempt_id=a.attempt_id, error_code=ErrorCode.WORKER_LEASE_EXPIRED,
        lost=True,
    )  # fmt: skip
    rig.worker.start()  # the start-up drain settles the entry
    assert _journal_state(rig, a) == "consumed"
    assert not path.exists(), "the job's cgroup was left behind"
    assert terminal_events(rig.engine, a.run_id) == ["attempt.lost", "run.lost"]


def test_a_job_gone_before_the_pass_is_lost_and_not_counted_stopped(rig: Rig) -> None:
    # A restored backup (docs/operations.md §3): its running attempt's job and shim are long
    # gone. The pass stops nothing, and its log line must not say it stopped a job.
    gone = subprocess.Popen(["sleep", "60"], start_new_session=True)
    real = read_identity(gone.pid)
    assert real is not None
    gone.kill()
    gone.wait(DEADLINE)
    a = rig.arm()
    handle = ProcessHandle(
        boot_id=current_boot_id(), pid=real.pid, pgid=real.pgid, start_ticks=real.start_ticks,
        shim_pid=real.pid, shim_start_ticks=real.start_ticks, cgroup=f"ql-{a.attempt_id}",
    )  # fmt: skip
    rig.runs.record_running(
        run_id=a.run_id, attempt_id=a.attempt_id, handle=handle, started_at_ms=now_ms()
    )
    report = in_process_reconciler(rig.engine, rig.store, [now_ms()]).run_pass()
    assert (report.lost, report.stopped) == (1, 0)
    assert terminal_events(rig.engine, a.run_id) == ["attempt.lost", "run.lost"]
