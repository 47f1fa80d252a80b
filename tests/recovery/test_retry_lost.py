"""``lost`` is retried only when the attempt's processes are proven gone (docs/retries.md §3),
against a real worker: a handle nobody can verify (the outcome is unknown, nobody is
signalled) ends the run ``lost`` with no successor even though the policy retries ``lost``,
so a retry can never run beside a job that may still live. The proven-gone codes are
retried: tests/storage/test_retries.py::test_lost_is_retried_only_when_its_processes_are_proven_gone.
"""

from __future__ import annotations

import subprocess

from app.domain.errors import ErrorCode
from app.domain.ids import now_ms
from app.domain.model import ProcessHandle
from app.domain.retry import RetryPolicy
from app.storage.definitions_repo import DefinitionRepository
from app.worker.identity import current_boot_id, read_identity
from tests.recovery.kit import DEADLINE, Rig, terminal_events

RETRY_LOST = RetryPolicy(max_attempts=3, initial_delay_seconds=3600, max_delay_seconds=3600,
                         on=("lost",))  # fmt: skip


def _define_flaky(rig: Rig) -> None:
    DefinitionRepository(rig.engine).put_revision(
        task="flaky", revision=1, executor="local_process", argv=["true"], cwd=None,
        recipe=None, timeout_seconds=None, priority=0, retry=RETRY_LOST,
    )  # fmt: skip


def test_a_lost_attempt_whose_processes_may_live_is_not_retried(rig: Rig) -> None:
    _define_flaky(rig)
    bystander = subprocess.Popen(["sleep", "60"])  # not a group leader: never ours to signal
    try:
        real = read_identity(bystander.pid)
        assert real is not None
        odd = ProcessHandle(
            boot_id=current_boot_id(), pid=real.pid, pgid=real.pgid,
            start_ticks=real.start_ticks, shim_pid=real.pid, shim_start_ticks=real.start_ticks,
        )  # fmt: skip
        a = rig.arm(task="flaky")
        rig.runs.record_running(
            run_id=a.run_id, attempt_id=a.attempt_id, handle=odd, started_at_ms=now_ms()
        )
        rig.worker.start()
        rig.assert_ended(a, ErrorCode.RECOVERY_IDENTITY_UNSUPPORTED)  # one terminal pair
        run = rig.run(a)
        assert (run.attempts, run.next_attempt_at_ms) == (1, None)
        assert bystander.poll() is None
        assert terminal_events(rig.engine, a.run_id) == ["attempt.lost", "run.lost"]
    finally:
        bystander.kill()
        bystander.wait(DEADLINE)
