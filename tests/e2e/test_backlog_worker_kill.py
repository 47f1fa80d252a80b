"""Issue 11 §1 end to end: the worker alone SIGKILLed (twice) while a backlog is enqueued.

A real ``qinglong serve``; the worker is killed by pid and restarted by the supervisor. No
run may fail because the executor was away: the runs succeed, each with one terminal event,
and any attempt before its last one ended EXECUTOR_UNAVAILABLE (requeued, nothing spawned).
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.e2e.conftest import Served, ServeFactory, wait_until
from tests.e2e.kit import TERMINAL, enqueue, get_run, put_task, terminal_events
from tests.kit import web

pytestmark = pytest.mark.e2e

RUNS = 60
KILL_AFTER = (15, 40)


def _kill_worker(served: Served) -> None:
    """SIGKILL the answering worker by pid (a direct child of the supervisor); no wait."""
    wait_until("a worker that answers", lambda: served.ping_pid() is not None, 30)
    os.kill(served.service_pids()["worker"], signal.SIGKILL)


def test_a_worker_killed_twice_mid_backlog_fails_no_run(
    serve_factory: ServeFactory, db_url: str
) -> None:
    served = serve_factory(database_url=db_url)
    put_task(served, "quick", "true")
    ids = []
    for n in range(1, RUNS + 1):
        ids.append(enqueue(served, "quick"))
        if n in KILL_AFTER:
            _kill_worker(served)  # the enqueues go on while the supervisor restarts it
    wait_until(
        "every run to end",
        lambda: all(get_run(served, run_id)["status"] in TERMINAL for run_id in ids),
        120,
    )
    runs = [get_run(served, run_id) for run_id in ids]
    others = [
        (r["status"], r["latest_attempt"]["error_code"]) for r in runs if r["status"] != "succeeded"
    ]
    # Every run succeeds: no EXECUTOR_START_FAILED, RECOVERY_START_NOT_SPAWNED or
    # EXECUTOR_UNAVAILABLE ending, and a kill between the journal's reservation and its
    # spawn record is settled by the shim's receipt reservation (docs/reserved-launch.md):
    # requeued when no shim took it, the job's own ending when one did.
    assert others == [], others
    for run in runs:
        assert terminal_events(served, run["id"]) == [f"run.{run['status']}"]
        number = run["latest_attempt"]["number"]
        if number > 1:
            attempts = web.get(
                f"{served.base_url}/api/v1/runs/{run['id']}/attempts", headers=served.auth
            ).json()["items"]
            assert [(a["status"], a["error_code"]) for a in attempts[:-1]] == [
                ("failed", "EXECUTOR_UNAVAILABLE")
            ] * (number - 1)
    assert served.ping_pid() is not None  # the restarted worker answers
