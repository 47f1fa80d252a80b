"""What a user does, through the REST API alone, against a real ``qinglong serve``.

Define a task with a recipe and a secret, enqueue it, watch it run, read and follow its log,
and see its exact ending; then the endings a job runner must tell apart (success, failure,
timeout, cancel). On SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.e2e.conftest import (
    ServeFactory,
    alive,
    descendants,
    kill_exact,
    proc_stat,
    wait_until,
)
from tests.e2e.kit import (
    TERMINAL,
    enqueue,
    events,
    get_run,
    put_task,
    read_log,
    terminal_events,
    wait_status,
)
from tests.kit import web

pytestmark = pytest.mark.e2e

SECRET = "s3cr3t-value-that-must-never-leak-6d1f"


def _follow(base_url: str, path: str, headers: dict[str, str]) -> tuple[bytes, dict[str, object]]:
    """Follow a log as SSE until the final ``end`` event; (text, end data)."""
    text = b""
    end: dict[str, object] = {}
    with web.stream(
        "GET", f"{base_url}{path}?follow=true", headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: ") and event == "chunk":
                text += json.loads(line.removeprefix("data: "))["text"].encode()
            elif line.startswith("data: ") and event == "end":
                end = json.loads(line.removeprefix("data: "))
                break
    return text, end


def test_define_enqueue_watch_follow_and_read_the_exact_ending(
    serve_factory: ServeFactory, db_url: str, tmp_path: Path
) -> None:
    served = serve_factory(database_url=db_url)
    base, auth = served.base_url, served.auth
    gate = tmp_path / "gate"

    assert web.put(
        f"{base}/api/v1/secrets/api-token", json={"value": SECRET}, headers=auth
    ).status_code == 204  # fmt: skip
    recipe = web.post(
        f"{base}/api/v1/recipes",
        json={
            "env": {"GREETING": "hello", "GATE": str(gate)},
            "secrets": {"API_TOKEN": "api-token"},
        },
        headers=auth,
    )
    assert recipe.status_code == 201, recipe.text
    script = (
        'echo "$GREETING from $QL3_TASK"; '
        '[ "$API_TOKEN" = "' + SECRET + '" ] && echo secret-ok; '
        'while [ ! -e "$GATE" ]; do sleep 0.05; done; '
        "echo after-gate; exit 7"
    )
    put_task(served, "journey", script, recipe=recipe.json()["id"])

    run_id = enqueue(served, "journey", key="journey-1")
    again = web.post(
        f"{base}/api/v1/runs",
        json={"task": "journey"},
        headers=dict(auth) | {"Idempotency-Key": "journey-1"},
    )
    assert (again.status_code, again.json()["id"]) == (200, run_id)

    running = wait_status(served, run_id, {"running"})
    assert running["latest_attempt"]["status"] == "running"
    wait_until("the first lines", lambda: b"secret-ok" in read_log(served, run_id), 20)
    gate.touch()
    followed, end = _follow(base, f"/api/v1/runs/{run_id}/attempts/1/log", auth)
    assert end["status"] == "failed"

    run = wait_status(served, run_id, TERMINAL)
    attempt = run["latest_attempt"]
    assert (run["status"], attempt["status"], attempt["exit_code"], attempt["signal"]) == (
        "failed", "failed", 7, None,
    )  # fmt: skip
    log = read_log(served, run_id)
    assert log == b"hello from journey\nsecret-ok\nafter-gate\n" == followed
    assert attempt["log"] == {
        "bytes": len(log), "truncated": False, "dropped_bytes": 0, "truncation_reason": None,
        "dropped_at": None, "expired": False, "expired_at_ms": None,
    }  # fmt: skip
    assert [e["type"] for e in events(served, run_id)] == [
        "run.queued", "run.dispatching", "attempt.starting", "attempt.running",
        "run.running", "attempt.failed", "run.failed",
    ]  # fmt: skip
    # The secret reached the job and nothing the service keeps or says.
    for response in (web.get(f"{base}/api/v1/runs/{run_id}/events", headers=auth),
                     web.get(f"{base}/api/v1/runs/{run_id}", headers=auth)):  # fmt: skip
        assert SECRET not in response.text and "pid" not in response.json()
    if db_url.startswith("sqlite"):
        for path in served.data_dir.rglob("*"):
            if path.is_file() and not path.name.endswith(".log"):
                assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in served.log()


def test_success_timeout_and_cancel_end_as_they_should_on_the_edge_profile(
    serve_factory: ServeFactory, db_url: str, tmp_path: Path
) -> None:
    served = serve_factory(database_url=db_url, extra_env={"QL_PROFILE": "edge"})
    put_task(served, "ok", "echo fine")
    put_task(served, "slow", "echo start; sleep 30", timeout_seconds=1)
    put_task(served, "endless", "trap '' TERM; echo start; while :; do sleep 0.1; done")

    ok, slow, endless = (enqueue(served, t) for t in ("ok", "slow", "endless"))
    assert wait_status(served, ok, TERMINAL)["latest_attempt"]["exit_code"] == 0
    assert get_run(served, ok)["status"] == "succeeded"

    timed_out = wait_status(served, slow, TERMINAL, timeout=60)
    assert timed_out["status"] == "timed_out"
    assert timed_out["cancel_requested"]["reason"] == "timeout"

    wait_status(served, endless, {"running"})
    cancel = web.post(f"{served.base_url}/api/v1/runs/{endless}/cancel", headers=served.auth)
    assert cancel.status_code == 202
    # The job ignores TERM: the worker escalates to KILL after the grace, identity re-checked.
    cancelled = wait_status(served, endless, TERMINAL, timeout=60)
    assert cancelled["status"] == "cancelled"
    assert cancelled["latest_attempt"]["signal"] == signal.SIGKILL
    again = web.post(f"{served.base_url}/api/v1/runs/{endless}/cancel", headers=served.auth)
    assert (again.status_code, again.json()["code"]) == (409, "RUN_TERMINAL")
    for run_id in (ok, slow, endless):
        assert len(terminal_events(served, run_id)) == 1


def test_kill9_every_api_worker_and_the_worker_while_five_jobs_run(
    serve_factory: ServeFactory, db_url: str, tmp_path: Path
) -> None:
    served = serve_factory(database_url=db_url, workers=2)
    gate = tmp_path / "gate"
    for i in range(5):
        put_task(
            served,
            f"job-{i}",
            f"echo before-{i}; while [ ! -e {gate} ]; do sleep 0.05; done; echo after-{i}; exit {10 + i}",
        )
    run_ids = [enqueue(served, f"job-{i}") for i in range(5)]
    for run_id in run_ids:
        wait_status(served, run_id, {"running"})

    # kill -9 the worker and every uvicorn process (manager and workers) of the api.
    pids = served.service_pids()
    victims = descendants(pids["api"])  # the uvicorn workers, {pid: start ticks}
    for pid in (pids["worker"], pids["api"]):
        stat = proc_stat(pid)
        assert stat is not None
        victims[pid] = stat[3]
    assert len(victims) >= 4  # worker, uvicorn manager and its two workers
    # By exact identity: a uvicorn worker may already be gone once its manager died.
    for pid, start_ticks in victims.items():
        kill_exact(pid, start_ticks)
    wait_until("the killed services are gone", lambda: not any(alive(p, t) for p, t in victims.items()), 20)
    gate.touch()  # the jobs write their second line only after every service process died

    wait_until("the api and worker are back", lambda: served.service_pids().keys() == {"api", "worker"}
               and served.healthz_ok(), 60)  # fmt: skip
    for i, run_id in enumerate(run_ids):
        run = wait_status(served, run_id, TERMINAL, timeout=60)
        assert (run["status"], run["latest_attempt"]["exit_code"]) == ("failed", 10 + i)
        assert read_log(served, run_id) == f"before-{i}\nafter-{i}\n".encode()
        assert terminal_events(served, run_id) == ["run.failed"]
