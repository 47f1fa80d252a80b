"""Jobs across a ``qinglong serve`` shutdown: left running by default, stopped with the flag.

On SQLite and PostgreSQL (``db_url``).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from app.cli.serve import GRACEFUL_SHUTDOWN_S
from app.domain.artifacts import log_relpath
from app.domain.ids import now_ms
from app.storage.engine import make_engine
from app.storage.tables import run_events, runs
from tests.e2e.conftest import ServeFactory, alive, end_jobs, kill_exact, wait_until
from tests.e2e.kit import TERMINAL
from tests.e2e.kit import enqueue as _enqueue
from tests.e2e.kit import get_run as _run
from tests.e2e.kit import put_task as _put_task
from tests.e2e.kit import terminal_events as _terminal_events
from tests.e2e.kit import wait_status as _wait_status
from tests.kit import web

pytestmark = pytest.mark.e2e


def test_a_job_outlives_the_supervisor_and_its_ending_is_recorded_after_restart(
    serve_factory: ServeFactory, db_url: str, tmp_path: Path
) -> None:
    served = serve_factory(database_url=db_url)
    _put_task(
        served,
        "waits-for-go",
        "echo before; while [ ! -e GO ]; do sleep 0.05; done; echo after; exit 7",
        tmp_path,
    )
    run_id = _enqueue(served, "waits-for-go")
    _wait_status(served, run_id, {"running"})

    try:
        assert served.stop(leave_jobs=True) == 0
        assert served.left_jobs, "the job's shim and process keep running"
        assert any(alive(p, t) for p, t in served.left_jobs.items())

        again = serve_factory(data_dir=served.data_dir, database_url=db_url)
        assert _run(again, run_id)["status"] == "running"
        (tmp_path / "GO").touch()
        run = _wait_status(again, run_id, TERMINAL)
    finally:
        (tmp_path / "GO").touch()  # the job ends on its own; anything still alive is killed
        try:
            wait_until(
                "the job processes to end",
                lambda: not any(alive(p, t) for p, t in served.left_jobs.items()),
                30,
            )
        finally:
            for pid, ticks in served.left_jobs.items():
                kill_exact(pid, ticks)

    assert run["status"] == "failed"
    assert run["latest_attempt"]["exit_code"] == 7
    assert _terminal_events(again, run_id) == ["run.failed"]
    log = web.get(f"{again.base_url}/api/v1/runs/{run_id}/attempts/1/log", headers=again.auth).text
    assert log.splitlines() == ["before", "after"]


def test_stop_jobs_on_exit_stops_running_jobs_and_they_end_cancelled(
    serve_factory: ServeFactory, db_url: str, tmp_path: Path
) -> None:
    served = serve_factory(stop_jobs_on_exit=True, database_url=db_url)
    _put_task(served, "forever", "echo up; while :; do sleep 0.05; done", tmp_path)
    run_id = _enqueue(served, "forever")
    _wait_status(served, run_id, {"running"})

    # The fixture's check covers it: no shim or job process is left after the exit.
    assert served.stop() == 0
    log = served.log()
    assert "stop-jobs-on-exit: asked the worker to stop 1 job(s); 1 recorded" in log
    assert "stopping the services in order (the jobs before the worker: --stop-jobs-on-exit)" in log
    # Stopped while the worker still ran: it recorded the ending before it stopped, so the run
    # is cancelled now, with the instant it ended, not at the host's next start (several-hosts
    # walk-through: a host stopped for good left them running for ever).
    assert log.index("stop-jobs-on-exit:") < log.index("stopping worker")
    assert "after the services" not in log  # the second look found nothing left
    assert "not recorded before the worker stops" not in log
    stopped_at_ms = now_ms()
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(
                select(runs.c.status, runs.c.finished_at_ms).where(runs.c.id == run_id)
            ).one()
            endings = conn.execute(
                select(run_events.c.type).where(
                    run_events.c.run_id == run_id, run_events.c.type == "run.cancelled"
                )
            ).all()
            asked = conn.execute(
                select(run_events.c.data).where(
                    run_events.c.run_id == run_id, run_events.c.type == "run.cancel_requested"
                )
            ).scalar_one()
    finally:
        engine.dispose()
    assert row.status == "cancelled" and row.finished_at_ms <= stopped_at_ms
    assert len(endings) == 1
    # The reason older builds read, and the event says who asked (the UI's words for it).
    assert json.loads(asked) == {"reason": "user", "service_stop": True}

    again = serve_factory(data_dir=served.data_dir, database_url=db_url)
    run = _wait_status(again, run_id, TERMINAL)
    assert run["status"] == "cancelled"
    assert run["cancel_requested"]["reason"] == "user"  # service_stop once older builds read it
    assert _terminal_events(again, run_id) == ["run.cancelled"]


def test_a_serve_killed_while_it_stops_its_jobs_leaves_each_run_one_ending(
    serve_factory: ServeFactory, db_url: str, tmp_path: Path
) -> None:
    """The crash window of ``--stop-jobs-on-exit``: the cancel intent is written and the
    worker is stopping the job (TERM ignored, so it waits the stop grace) when the supervisor
    and the worker are SIGKILLed. The job lives on; the next start stops it by identity and
    records the run ``cancelled``, once. The edge profile's stop grace (5 s) is waited twice."""
    edge = {"QL_PROFILE": "edge"}
    served = serve_factory(stop_jobs_on_exit=True, database_url=db_url, extra_env=edge)
    _put_task(served, "stubborn", "trap '' TERM; echo up; while :; do sleep 0.05; done", tmp_path)
    run_id = _enqueue(served, "stubborn")
    _wait_status(served, run_id, {"running"})
    engine = make_engine(db_url)
    try:
        os.kill(served.pid, signal.SIGTERM)

        def asked() -> bool:
            with engine.connect() as conn:
                row = conn.execute(
                    select(runs.c.status, runs.c.cancel_reason).where(runs.c.id == run_id)
                ).one()
            assert row.status == "running", "the job ignores TERM: it ends at the grace's end"
            return row.cancel_reason is not None

        wait_until("the stop's cancel intent", asked, 20)
        served.kill_host(leave_jobs=True)
        assert any(alive(p, t) for p, t in served.left_jobs.items()), "the job goes on"
        with engine.connect() as conn:
            status = conn.execute(select(runs.c.status).where(runs.c.id == run_id)).scalar_one()
        assert status == "running"

        again = serve_factory(data_dir=served.data_dir, database_url=db_url, extra_env=edge)
        run = _wait_status(again, run_id, TERMINAL)
        wait_until(
            "the job processes to end",
            lambda: not any(alive(p, t) for p, t in served.left_jobs.items()),
            30,
        )
    finally:
        engine.dispose()
        end_jobs(served.left_jobs)  # a failure above may leave the job and its cgroup
    assert run["status"] == "cancelled"
    assert _terminal_events(again, run_id) == ["run.cancelled"]
    log = web.get(f"{again.base_url}/api/v1/runs/{run_id}/attempts/1/log", headers=again.auth)
    assert log.text.splitlines() == ["up"]


def test_a_log_removed_while_its_job_runs_reads_410_log_missing_after_the_ending(
    serve_factory: ServeFactory, tmp_path: Path
) -> None:
    """The ending finds no file, so no size is recorded; the output is lost, and the log must
    not read as an empty 200 (a job that printed nothing)."""
    served = serve_factory()
    _put_task(
        served,
        "prints",
        "echo before; while [ ! -e GO ]; do sleep 0.05; done; echo after",
        tmp_path,
    )
    run_id = _enqueue(served, "prints")
    try:
        _wait_status(served, run_id, {"running"})
        attempts = web.get(
            f"{served.base_url}/api/v1/runs/{run_id}/attempts", headers=served.auth
        ).json()
        log = served.data_dir / "logs" / log_relpath(attempts["items"][0]["id"])
        wait_until("the job's first line", lambda: log.exists() and log.stat().st_size > 0, 10)
        log.unlink()
    finally:
        (tmp_path / "GO").touch()
    assert _wait_status(served, run_id, TERMINAL)["status"] == "succeeded"
    answer = web.get(f"{served.base_url}/api/v1/runs/{run_id}/attempts/1/log", headers=served.auth)
    assert answer.status_code == 410, answer.text
    assert answer.json()["code"] == "LOG_MISSING"
    assert "its size was never recorded" in answer.json()["detail"]


def test_a_log_follow_open_at_the_stop_ends_at_once_for_the_client_to_resume(
    serve_factory: ServeFactory, tmp_path: Path
) -> None:
    served = serve_factory()
    _put_task(served, "ticks", "echo tick; while [ ! -e GO ]; do sleep 0.05; done", tmp_path)
    run_id = _enqueue(served, "ticks")
    _wait_status(served, run_id, {"running"})
    url = f"{served.base_url}/api/v1/runs/{run_id}/attempts/1/log"
    stopped: list[int] = []
    stopper = threading.Thread(target=lambda: stopped.append(served.stop(leave_jobs=True)))
    try:
        with web.stream(
            "GET", url, params={"follow": "true"}, headers=served.auth, timeout=30
        ) as follow:
            lines = follow.iter_lines()
            assert next(line for line in lines if line.startswith("data:")).endswith('"tick\\n"}')
            began = time.monotonic()
            stopper.start()
            rest = list(lines)  # a stream cut at uvicorn's graceful bound raises here
            took = time.monotonic() - began
        stopper.join(timeout=60)
        assert stopped == [0]
        assert ": the api stops: the stream ends; resume with Last-Event-ID" in rest
        assert took < GRACEFUL_SHUTDOWN_S, took
        assert "graceful shutdown exceeded" not in served.log()
    finally:
        (tmp_path / "GO").touch()
        stopper.join(timeout=60)
        wait_until(
            "the job processes to end",
            lambda: not any(alive(p, t) for p, t in served.left_jobs.items()),
            30,
        )
