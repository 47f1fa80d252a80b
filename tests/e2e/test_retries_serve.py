"""Retries end to end through a real ``qinglong serve`` on SQLite and PostgreSQL
(docs/retries.md): a job that fails twice then succeeds ends ``succeeded`` after 3 attempts,
each with its own log, with one terminal event, although the api was SIGKILLed during its
first backoff (the retry starts at the stored instant, not before); a cancel during the
backoff ends the run at once; a rerun is a new manual run of the same revision,
idempotent by key. One server per engine: each start costs seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Served, ServeFactory, proc_stat, wait_until
from tests.e2e.kit import enqueue, events, get_run, read_log, terminal_events, wait_status
from tests.kit import web
from tests.worker.kit import kill_exact

pytestmark = pytest.mark.e2e


def _put(served: Served, name: str, script: str, retry: dict[str, Any]) -> None:
    body = {"argv": ["/bin/sh", "-c", script], "retry": retry}
    r = web.put(
        f"{served.base_url}/api/v1/tasks/{name}/revisions/1", json=body, headers=served.auth
    )
    assert r.status_code == 201, r.text
    assert r.json()["retry"]["max_attempts"] == retry["max_attempts"]


def _waiting(served: Served, run_id: str) -> dict[str, Any]:
    wait_until("a retry to wait", lambda: get_run(served, run_id)["attempts"] == 2, 30)
    run = get_run(served, run_id)
    assert run["status"] == "queued" and run["next_attempt_at_ms"] is not None
    return run


def test_retries_backoff_cancel_restart_and_rerun(
    serve_factory: ServeFactory, db_url: str, tmp_path: Path
) -> None:
    served = serve_factory(database_url=db_url)
    count = tmp_path / "count"
    _put(
        served,
        "flaky",
        f"n=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}; "
        f'echo "attempt $n"; [ "$n" -ge 3 ]',
        {"max_attempts": 3, "initial_delay_seconds": 5, "factor": 1, "on": ["failed"]},
    )
    _put(served, "doomed", "exit 1", {"max_attempts": 5, "initial_delay_seconds": 600})
    doomed = enqueue(served, "doomed")

    # Cancel during the backoff: cancelled at once, its one terminal event, no attempt 3.
    _waiting(served, doomed)
    r = web.post(f"{served.base_url}/api/v1/runs/{doomed}/cancel", headers=served.auth)
    assert r.status_code == 202 and r.json()["status"] == "cancelled", r.text
    assert terminal_events(served, doomed) == ["run.cancelled"]

    # The api SIGKILLed during the backoff: the retry starts at the same stored instant.
    # Enqueued only now, so its 5 s backoff is still running when the test looks (the
    # doomed run's steps took longer than a shorter one on a loaded host).
    flaky = enqueue(served, "flaky")
    at = _waiting(served, flaky)["next_attempt_at_ms"]
    api = served.service_pids()["api"]
    stat = proc_stat(api)
    assert stat is not None
    kill_exact(api, stat[3])
    wait_until("a new api", lambda: served.service_pids().get("api") not in (None, api), 30)
    served.wait_services()

    # Fails twice, then succeeds: 3 attempts, 3 logs, 2 retries, one terminal event.
    run = wait_status(served, flaky, {"succeeded", "failed"}, timeout=60)
    assert (run["status"], run["attempts"], run["next_attempt_at_ms"]) == ("succeeded", 3, None)
    for n in (1, 2, 3):
        assert read_log(served, flaky, n) == f"attempt {n}\n".encode()
    types = [e["type"] for e in events(served, flaky)]
    assert types.count("run.retry_scheduled") == 2
    assert terminal_events(served, flaky) == ["run.succeeded"]
    items = web.get(f"{served.base_url}/api/v1/runs/{flaky}/attempts", headers=served.auth)
    second, third = items.json()["items"][1:]
    assert second["not_before_ms"] == at  # the instant stored before the kill
    for item in (second, third):
        assert item["started_at_ms"] >= item["not_before_ms"]

    # A rerun: a new manual run of the same revision, the same answer for the same key.
    url, key = f"{served.base_url}/api/v1/runs/{flaky}/rerun", {"Idempotency-Key": "again-1"}
    first = web.post(url, headers=served.auth | key)
    assert first.status_code == 201, first.text
    rerun = first.json()
    assert (rerun["trigger"]["kind"], rerun["trigger"]["rerun_of"]) == ("manual", flaky)
    assert (rerun["task"], rerun["revision"]) == ("flaky", 1)
    again = web.post(url, headers=served.auth | key)
    assert (again.status_code, again.json()["id"]) == (200, rerun["id"])
    assert wait_status(served, rerun["id"], {"succeeded", "failed"})["status"] == "succeeded"
