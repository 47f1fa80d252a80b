"""A job still running for an attempt that already ended is stopped, wherever it is found.

The named crash point: the launch answer was lost, so the coordinator recorded the attempt
``failed`` EXECUTOR_START_FAILED, but the spawn had happened; then the shim was SIGKILLed
(nobody can publish its receipt any more) while the job runs on. Found by the worker's
start-up (the worker was SIGKILLed too and starts again) or by the periodic sweep (the
worker was frozen with SIGSTOP meanwhile), the job is stopped by exact identity before its
journal entry is consumed, and the run keeps its one ending (journal_settle.py).
"""

from __future__ import annotations

import os
import signal

from app.domain.errors import ErrorCode
from app.domain.model import ProcessHandle
from app.worker.identity import wait_exit
from app.worker.probe import HandleProbe
from tests.recovery.kit import DEADLINE, Armed, Rig, gated, terminal_events, wait_for
from tests.worker.kit import kill_exact, stop_outside_a_write


def _spawned_then_given_up(rig: Rig) -> tuple[Armed, ProcessHandle]:
    """A running job whose attempt the coordinator failed (its launch answer was lost)."""
    a = rig.arm()
    h = rig.spawn(a, gated("never", then="exit 0"))  # no T2: the answer never reached the api
    wait_for(lambda: b"start" in rig.log_bytes(a), "the job to run")
    return a, h


def _end_and_kill_the_shim(rig: Rig, a: Armed, h: ProcessHandle) -> None:
    rig.runs.fail_attempt(
        run_id=a.run_id, attempt_id=a.attempt_id, error_code=ErrorCode.EXECUTOR_START_FAILED
    )
    kill_exact(h.shim_pid, h.shim_start_ticks)  # SIGKILL: no receipt will ever come
    assert not HandleProbe().shim_alive(h) and HandleProbe().job_alive(h)


def _assert_one_ending(rig: Rig, a: Armed) -> None:
    wait_for(lambda: _journal_state(rig, a) == "consumed", "the journal entry to settle")
    run = rig.run(a)
    assert run.latest_attempt is not None
    assert (run.status, run.latest_attempt.error_code) == (
        "failed", ErrorCode.EXECUTOR_START_FAILED.value,
    )  # fmt: skip
    assert terminal_events(rig.engine, a.run_id) == ["attempt.failed", "run.failed"]


def test_found_at_start_up_the_job_is_stopped_before_the_worker_serves(rig: Rig) -> None:
    rig.worker.start(t2=False)
    a, h = _spawned_then_given_up(rig)
    rig.kill_worker()
    _end_and_kill_the_shim(rig, a, h)
    rig.worker.start(t2=False)  # returns once the socket answers: after the start-up drain
    assert not HandleProbe().job_alive(h)  # stopped by the drain, not left to a later pass
    assert _journal_state(rig, a) == "consumed"
    assert rig.worker.client.wake(reconcile=True)  # a pass after it changes nothing
    _assert_one_ending(rig, a)


def test_found_by_the_periodic_sweep_the_job_is_stopped(rig: Rig) -> None:
    rig.worker.start(t2=False)
    a, h = _spawned_then_given_up(rig)
    assert rig.worker.proc is not None
    pid = rig.worker.proc.pid
    # Neither the watcher nor a pass can react meanwhile; frozen outside a write, so the
    # test's own writes do not wait on the frozen worker's database lock.
    stop_outside_a_write(rig.worker.proc, rig.engine)
    try:
        _end_and_kill_the_shim(rig, a, h)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert rig.worker.client.wake(reconcile=True)
    assert wait_exit(h.pid, DEADLINE)
    _assert_one_ending(rig, a)


def _journal_state(rig: Rig, a: Armed) -> str | None:
    entry = rig.journal.get(a.attempt_id)
    return None if entry is None else entry.state
