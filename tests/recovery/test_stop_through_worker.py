"""``serve --stop-jobs-on-exit`` stops the jobs through the running worker, which records
them: only when that worker answers holding its lease; otherwise nothing is touched.

A real worker subprocess and real jobs on both engines (``rig``). The supervisor's side (the
wait in its loop) is tests/integration/test_supervisor_before_stop.py; the whole of it
through ``qinglong serve`` is tests/e2e/test_serve_jobs.py.
"""

from __future__ import annotations

import time

from app.domain.profiles import EDGE
from app.settings import Settings
from app.supervisor.stop_jobs import stop_through_worker
from app.worker.identity import wait_exit
from tests.recovery.kit import DEADLINE, Rig, gated, terminal_events, wait_for


def _settings(rig: Rig) -> Settings:
    return Settings(
        data_dir=rig.data_dir, database_url=rig.worker.env["QL_DATABASE_URL"], profile=EDGE,
        worker_socket=rig.worker.socket_path,
    )  # fmt: skip


def test_the_worker_stops_and_records_the_jobs_and_another_pid_touches_nothing(
    rig: Rig,
) -> None:
    rig.worker.start()
    armed = [rig.arm() for _ in range(2)]
    handles = [
        rig.launch(a, gated("never", then="exit 0", tag=f"-{i}")) for i, a in enumerate(armed)
    ]
    wait_for(lambda: all(b"start" in rig.log_bytes(a) for a in armed), "every job to print")
    settings = _settings(rig)
    assert rig.worker.proc is not None
    # Not this serve's worker (a stale socket, another process): nothing is cancelled.
    assert stop_through_worker(settings, rig.worker.proc.pid + 1) is None
    assert all(rig.run(a).status == "running" and rig.run(a).cancel is None for a in armed)

    waiting = stop_through_worker(settings, rig.worker.proc.pid)
    assert waiting is not None
    assert waiting.deadline > time.monotonic()
    wait_for(waiting.done, "the worker to stop and record every job")
    waiting.close(finished=True)
    for a, h in zip(armed, handles, strict=True):
        assert wait_exit(h.pid, DEADLINE)
        assert rig.run(a).status == "cancelled"
        assert terminal_events(rig.engine, a.run_id) == ["attempt.cancelled", "run.cancelled"]
    assert rig.worker.proc.poll() is None  # the worker itself is stopped by the supervisor


def test_nothing_is_touched_when_no_worker_answers(rig: Rig) -> None:
    a = rig.arm()
    assert stop_through_worker(_settings(rig), 999_999) is None  # no socket at all
    assert rig.run(a).cancel is None
