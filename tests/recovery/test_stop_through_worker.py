"""``serve --stop-jobs-on-exit`` stops the jobs through the running worker, which records
them: only when that worker answers holding its lease; otherwise nothing is touched. What
that left is stopped after the services, holding this host's lease: never while a live
worker holds it.

A real worker subprocess and real jobs on both engines (``rig``). The supervisor's side (the
wait in its loop) is tests/integration/test_supervisor_before_stop.py; the whole of it
through ``qinglong serve`` is tests/e2e/test_serve_jobs.py.
"""

from __future__ import annotations

import logging
import time

import pytest

from app.domain.profiles import EDGE
from app.settings import Settings
from app.supervisor.stop_jobs import stop_active_jobs, stop_through_worker
from app.worker.identity import wait_exit
from tests.recovery.kit import DEADLINE, Rig, gated, terminal_events, wait_for


def _settings(rig: Rig) -> Settings:
    return Settings(
        data_dir=rig.data_dir, database_url=rig.worker.env["QL_DATABASE_URL"], profile=EDGE,
        worker_socket=rig.worker.socket_path,
    )  # fmt: skip


def test_the_worker_stops_and_records_the_jobs_and_another_pid_touches_nothing(
    rig: Rig, caplog: pytest.LogCaptureFixture
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
    other = stop_through_worker(settings, rig.worker.proc.pid + 1)
    wait_for(other.done, "the look to end")
    other.close(finished=True)
    assert all(rig.run(a).status == "running" and rig.run(a).cancel is None for a in armed)
    # Nor after the services while this worker holds the lease.
    assert stop_active_jobs(settings) == {"held": 1}
    assert all(rig.run(a).cancel is None for a in armed)

    caplog.set_level(logging.INFO, logger="qinglong.supervisor")
    waiting = stop_through_worker(settings, rig.worker.proc.pid)
    assert waiting.deadline > time.monotonic()
    wait_for(waiting.done, "the worker to stop and record every job")
    waiting.close(finished=True)
    assert "asked the worker to stop 2 job(s); 2 recorded" in caplog.text
    for a, h in zip(armed, handles, strict=True):
        assert wait_exit(h.pid, DEADLINE)
        assert rig.run(a).status == "cancelled"
        assert terminal_events(rig.engine, a.run_id) == ["attempt.cancelled", "run.cancelled"]
    assert rig.worker.proc.poll() is None  # the worker itself is stopped by the supervisor


def test_with_the_worker_gone_the_jobs_are_stopped_after_it_and_recorded_at_its_start(
    rig: Rig,
) -> None:
    rig.worker.start()
    a = rig.arm()
    h = rig.launch(a, gated("never", then="exit 0"))
    wait_for(lambda: b"start" in rig.log_bytes(a), "the job to print")
    rig.kill_worker()  # its lease is still on the row: the fallback takes it over at once
    settings = _settings(rig)
    waiting = stop_through_worker(settings, 999_999)  # nobody answers
    wait_for(waiting.done, "the look to end")
    waiting.close(finished=True)
    assert rig.run(a).cancel is None  # nothing touched through a worker that is not there
    counts = stop_active_jobs(settings)
    assert counts == {"stopped": 1}
    assert wait_exit(h.pid, DEADLINE)
    rig.worker.start()  # its start records the ending from the shim's receipt
    assert rig.wait_status(a).status == "cancelled"
    assert terminal_events(rig.engine, a.run_id) == ["attempt.cancelled", "run.cancelled"]
