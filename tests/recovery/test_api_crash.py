"""kill -9 of the api inside a start, at the windows of the coordinator (docs/design.md §3.7):
T1 committed but the launch never sent; the launch answered (the worker committed T2 with
its spawn record); and, with a worker that leaves T2 to the api, the job launched and
journaled but T2 never committed.

The api is a real process with the api's own execution wiring (``crash_api.py``: its
context, background drain, dispatcher, coordinator and worker client), halted at the named
point and SIGKILLed there by pid; the worker is the real ``qinglong worker``. Recovery is the
worker's own reconciler, woken once the start grace has really passed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from sqlalchemy import select

from app.domain.errors import ErrorCode
from app.domain.model import ProcessHandle
from app.storage.definitions_repo import DefinitionRepository
from app.storage.tables import attempts
from app.worker.identity import wait_exit
from tests.recovery.kit import DEADLINE, ROOT, Armed, Rig, gated, terminal_events, wait_for


def _killed_inside_a_start(rig: Rig, point: str, argv: list[str]) -> Armed:
    """Queue one run, let a halting api dispatch it to ``point``, SIGKILL the api there."""
    DefinitionRepository(rig.engine).put_revision(
        task="held", revision=1, executor="local_process", argv=argv, cwd=str(rig.data_dir),
        recipe=None, timeout_seconds=None, priority=0,
    )  # fmt: skip
    run, _ = rig.runs.enqueue_run(task="held", revision=1, priority=None)
    assert run.latest_attempt is not None
    mark = rig.data_dir / f"api-halted-{point}"
    env = rig.worker.env | {"QLTEST_CRASH_AT": point, "QLTEST_CRASH_MARK": str(mark)}
    with open(rig.data_dir / "api.stderr", "ab") as log:
        api = subprocess.Popen(
            [sys.executable, "-m", "tests.recovery.crash_api"], cwd=ROOT, env=env,
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        )  # fmt: skip
    rig.procs.track_pid(api.pid)
    try:
        wait_for(lambda: mark.exists() or api.poll() is not None, "the api to reach its point")
        assert mark.exists(), (rig.data_dir / "api.stderr").read_text()
    finally:
        api.send_signal(signal.SIGKILL)
        assert api.wait(DEADLINE) == -signal.SIGKILL
    return Armed(run.id, run.latest_attempt.id, token="")


def test_api_killed_after_t1_before_the_launch(rig: Rig) -> None:
    rig.worker.start()
    a = _killed_inside_a_start(rig, "after_t1", ["/bin/sh", "-c", "echo ran"])
    assert rig.run(a).status == "dispatching"
    assert rig.journal.get(a.attempt_id) is None  # the worker never heard of it
    rig.past_start_grace(a)
    assert rig.worker.client.wake(reconcile=True)
    # Provably nothing spawned (fenced, then requeued): the run is not failed for it.
    rig.assert_requeued(a)
    assert rig.log_bytes(a) == b""  # nothing ran


def test_api_killed_after_the_launch_before_t2(rig: Rig) -> None:
    # A worker that leaves T2 to the api, as every worker did before T2 moved into its spawn
    # transaction: what such a start left behind (say, before an upgrade) is still settled.
    rig.worker.start(t2=False)
    a = _killed_inside_a_start(rig, "before_t2", ["/bin/sh", "-c", gated("never", then="exit 0")])
    wait_for(lambda: b"start" in rig.log_bytes(a), "the job to run")
    entry = rig.journal.get(a.attempt_id)
    assert entry is not None and entry.state == "spawned" and entry.handle is not None
    rig.procs.track(entry.handle)
    assert rig.run(a).status == "dispatching"
    rig.past_start_grace(a)
    assert rig.worker.client.wake(reconcile=True)
    # Never a clean ending while the process may still run: stopped by identity, then lost.
    rig.assert_ended(a, ErrorCode.RECOVERY_START_INTERRUPTED)
    assert wait_exit(entry.handle.pid, DEADLINE) and wait_exit(entry.handle.shim_pid, DEADLINE)


def test_api_killed_after_the_launch_answered_the_run_runs_to_its_ending(rig: Rig) -> None:
    # The worker commits T2 with its spawn record (docs/design.md §3.7): an api killed once
    # the launch answered leaves a running run, never one for recovery to stop.
    rig.worker.start()
    a = _killed_inside_a_start(rig, "after_launch", ["/bin/sh", "-c", gated("go", then="exit 0")])
    wait_for(lambda: b"start" in rig.log_bytes(a), "the job to run")
    entry = rig.journal.get(a.attempt_id)
    assert entry is not None and entry.state == "spawned" and entry.handle is not None
    rig.procs.track(entry.handle)
    run = rig.run(a)
    assert run.status == "running" and run.latest_attempt is not None
    assert run.latest_attempt.status == "running"
    with rig.engine.connect() as conn:
        stored = conn.execute(
            select(attempts.c.handle).where(attempts.c.id == a.attempt_id)
        ).scalar_one()
    assert ProcessHandle.from_dict(json.loads(stored)) == entry.handle  # T2's, from the worker
    assert rig.worker.client.wake(reconcile=True)  # a running run: nothing for recovery
    assert rig.run(a).status == "running"
    rig.gate("go").touch()
    run = rig.wait_status(a)
    assert run.status == "succeeded"
    assert terminal_events(rig.engine, a.run_id) == ["attempt.succeeded", "run.succeeded"]
